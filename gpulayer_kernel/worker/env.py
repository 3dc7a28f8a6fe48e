"""The environment a job sees: an allow-list of the worker's, plus what the job declares.

The worker's own secrets and tokens (``GPULAYER_TOKEN``, cloud credentials, …) never reach a job
unless an operator adds their names to the allow-list on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
    }
)
ALLOWED_PREFIXES = ("LC_",)


def base_env(
    source: Mapping[str, str] | None = None, extra_allowed: Iterable[str] = ()
) -> dict[str, str]:
    """The allow-listed part of the worker's environment."""
    source = os.environ if source is None else source
    allowed = ALLOWED | frozenset(extra_allowed)
    return {k: v for k, v in source.items() if k in allowed or k.startswith(ALLOWED_PREFIXES)}


def job_env(
    base: Mapping[str, str],
    declared: Mapping[str, str],
    secrets: Mapping[str, str],
    gpulayer: Mapping[str, str],
) -> dict[str, str]:
    """Allow-list, then the job's variables and secrets, then GPUlayer's own (which win)."""
    env = dict(base)
    env.update(declared)
    env.update(secrets)
    # Output reaches the log view line by line, not in 4 KiB blocks at exit.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(gpulayer)
    return env
