"""What ``gpulayer run`` imports before its job is submitted (issue 14, item 5): ``-X importtime``.

A fresh ``$GPULAYER_HOME`` on a machine whose probe is cached: the command parses, opens the
embedded control plane and its local worker, and submits. None of the heavy modules is imported
before the ``submitted`` line: torch, tornado and the HTTP API (served a moment later, off the way
to the job), Jupyter and IPython, numpy, the HTTP client. Deterministic: it fails the day one of
them is imported on the way again. How long the imports take is measured, not tested
(``benchmarks/bench_imports.py``: a timed test failed on a loaded shared machine, issue 34).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer_kernel.capabilities.build import read_torch_build
from gpulayer_kernel.capabilities.driver import read_drivers
from gpulayer_kernel.capabilities.host import read_host
from gpulayer_kernel.capabilities.machine import MachineCache, machine_key
from gpulayer_kernel.contracts import WorkerCapabilities

pytestmark = pytest.mark.slow  # ~3 s: an interpreter with -X importtime

NEVER_BEFORE_SUBMIT = (
    "torch",
    "numpy",
    "tornado",
    "httpx",
    "IPython",
    "ipykernel",
    "jupyter_server",
    "gpulayer_kernel.api",
    "gpulayer_kernel.client.clients",
    "gpulayer_kernel.jupyter",
    "gpulayer_kernel.render",
    "gpulayer_kernel.capabilities.readers",
)


def imports(stderr: str, until: str | None = None) -> dict[str, int]:
    """Module -> its own import time (us) from ``-X importtime`` lines, up to ``until``."""
    out: dict[str, int] = {}
    for line in stderr.splitlines():
        if until is not None and until in line:
            return out
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, _cumulative, name = line.split(":", 1)[1].split("|")
            out[name.strip()] = int(self_us)
    if until is not None:
        raise AssertionError(f"no {until!r} line in:\n{stderr[-3000:]}")
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh home, and a per-machine cache that already has this machine's probe."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "home")
    env["GPULAYER_CACHE_DIR"] = str(tmp_path / "cache")
    key = machine_key(read_drivers(), read_torch_build(), env)
    caps = WorkerCapabilities(host=read_host())
    MachineCache(tmp_path / "cache").write(key, caps.model_dump(mode="json"))
    return env


def gpulayer(env: dict[str, str], *args: str) -> str:
    """``gpulayer ARGS`` under ``-X importtime``: its stderr (asserting success)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpulayer_kernel.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_gpulayer_run_imports_no_heavy_module_before_it_submits(env: dict[str, str]) -> None:
    before = imports(gpulayer(env, "run", "--", "true"), until="submitted")
    heavy = sorted(
        m for m in before if any(m == n or m.startswith(n + ".") for n in NEVER_BEFORE_SUBMIT)
    )
    assert heavy == [], f"imported before the job is submitted: {heavy}"


def test_the_commands_parser_imports_no_control_plane(env: dict[str, str]) -> None:
    """``gpulayer --help``, and every command against a served plane, parse first: the parser
    reads ``controlplane/audit.py``'s action names, not the control plane behind them (~200 ms
    of every command before, issue 34)."""
    loaded = imports(gpulayer(env, "--help"))
    heavy = sorted(
        m
        for m in loaded
        if m.startswith("gpulayer_kernel.controlplane.")
        and m != "gpulayer_kernel.controlplane.audit"
    )
    assert heavy == [], f"the parser imported: {heavy}"
    assert "gpulayer_kernel.cli.audit" in loaded  # the check reads what it says it reads


def test_a_worker_joined_over_http_imports_no_control_plane() -> None:
    """``gpulayer worker --url``: the agent, its HTTP transport and its command; the control
    plane is an annotation there only (it cost every remote worker ~200 ms at its start)."""
    code = (
        "import sys, gpulayer_kernel.cli.worker, gpulayer_kernel.worker.agent, "
        "gpulayer_kernel.worker.http; "
        "print(sorted(m for m in sys.modules if m.startswith('gpulayer_kernel.controlplane.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    # The command's parser reads audit's action names (see above): that module, and no other.
    assert done.stdout.strip() == "['gpulayer_kernel.controlplane.audit']", done.stdout


def test_a_jupyter_server_with_gpulayer_builds_no_iri_grammar() -> None:
    """``gpulayer lab`` and every Jupyter server with the extension: jsonschema ≥ 4.25 imported
    rfc3987-syntax, which builds a Lark grammar at import (~1 s of CPU in each such process,
    and in every kernel-less tool that reads a notebook). The jupyter extra keeps jsonschema
    below it (pyproject.toml says when to lift that)."""
    code = (
        "import sys, nbformat, jupyter_server.serverapp, gpulayer_kernel.jupyter.extension; "
        "print(sorted(m for m in ('lark', 'rfc3987_syntax') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
