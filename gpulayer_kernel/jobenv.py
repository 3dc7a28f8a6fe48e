"""The environment a user sends with a job: ``--env``, the same for ``gpulayer run`` and cells.

A job never inherits the submitting shell's environment: it may run on another machine, and the
worker starts it from an allow-list (``docs/security.md``). What it needs is named:
``--env KEY=VALUE`` sends that value, ``--env NAME`` sends NAME's current value here (an unset
NAME is an error naming it, not an empty string the job trips over later). Secrets go with
``--secret NAME`` instead, resolved on the worker and redacted from logs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from .contracts import parse_pairs
from .contracts.jobs import ENV_NAME_RE
from .errors import InvalidInput


def env_option(
    items: Iterable[str], flag: str = "--env", environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``--env`` values as a dict: ``KEY=VALUE`` as written, ``NAME`` from ``environ``.

    ``environ`` defaults to this process's environment (the shell that submits).
    """
    env = os.environ if environ is None else environ
    pairs: list[str] = []
    for item in items:
        if "=" in item:
            pairs.append(item)
            continue
        name = item.strip()
        if not ENV_NAME_RE.match(name):
            raise InvalidInput(
                f"{flag} {item!r} is neither KEY=VALUE nor a variable name",
                hint=f"{flag} NAME passes NAME's value from here; {flag} NAME=value sets one",
                details={"field": flag, "value": item},
            )
        if name not in env:
            raise InvalidInput(
                f"{flag} {name}: {name} is not set in this environment",
                hint=f"set it first (export {name}=...), or give the value: {flag} {name}=VALUE",
                details={"field": flag, "name": name},
            )
        pairs.append(f"{name}={env[name]}")
    return parse_pairs(pairs, flag)
