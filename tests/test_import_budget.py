"""What ``gpulayer run`` imports before its job is submitted (issue 14, item 5): ``-X importtime``.

A fresh ``$GPULAYER_HOME`` on a machine whose probe is cached: the command parses, opens the
embedded control plane and its local worker, and submits. Two checks on the modules imported
before the ``submitted`` line:

* **none of the heavy ones**: torch, tornado and the HTTP API (served a moment later, off the way
  to the job), Jupyter and IPython, numpy, the HTTP client. Deterministic: it fails the day one
  of them is imported on the way again;
* **a time budget**: the sum of their own import times (each module's least over five runs,
  which keeps a burst of load on a shared machine from counting) at most
  ``BUDGET_MS`` on a machine where a fixed set of standard-library imports takes
  ``REFERENCE_MS``, scaled by how long that set takes here and now (measured beside it, the same
  way), so a loaded or slower machine does not fail it and a regression of a few tens of ms does.

The issue's target is 150 ms; this tree imports ~340 ms before the submission on the 2-core
machine it was built on (see docs/performance.md, "Issue 14c": what is left and whose it is), so
``BUDGET_MS`` holds that figure with a margin and the report says what would move it.
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

pytestmark = pytest.mark.slow  # ~8 s: ten interpreters with -X importtime

# The goal is 150 ms; see the module docstring for why the budget is what it is.
BUDGET_MS = 420.0
RUNS = 5  # each module's least over these: a burst of load on a shared machine does not count
# The reference's import time (least of five) where BUDGET_MS was set: 2 vCPU AMD EPYC, load 2-3.
REFERENCE_MS = 66.0
REFERENCE = "import asyncio, sqlite3, json, logging, email.message, http.client, decimal, tarfile"
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


def least(runs: list[dict[str, int]]) -> int:
    """The sum over modules of each one's least import time across ``runs``."""
    best: dict[str, int] = {}
    for run in runs:
        for name, us in run.items():
            best[name] = min(best.get(name, us), us)
    return sum(best.values())


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


def test_gpulayer_run_imports_little_before_it_submits(env: dict[str, str], tmp_path: Path) -> None:
    runs: list[dict[str, int]] = []
    references: list[dict[str, int]] = []
    for k in range(RUNS):  # interleaved with the reference, so both see the same load
        env["GPULAYER_HOME"] = str(tmp_path / f"home-{k}")
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "gpulayer_kernel.cli", "run", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(imports(done.stderr, until="submitted"))
        ref = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", REFERENCE],
            capture_output=True,
            text=True,
            timeout=60,
        )
        references.append(imports(ref.stderr))

    before = runs[0]
    heavy = sorted(
        m for m in before if any(m == n or m.startswith(n + ".") for n in NEVER_BEFORE_SUBMIT)
    )
    assert heavy == [], f"imported before the job is submitted: {heavy}"

    spent = least(runs) / 1000
    reference = least(references) / 1000
    scale = max(1.0, reference / REFERENCE_MS)
    print(f"imports before the job is submitted: {spent:.0f} ms; reference {reference:.0f} ms")
    top = sorted(before.items(), key=lambda kv: -kv[1])[:12]
    shown = ", ".join(f"{name} {us / 1000:.1f}" for name, us in top)
    assert spent <= BUDGET_MS * scale, (
        f"{spent:.0f} ms of imports before the job is submitted; budget {BUDGET_MS:.0f} ms x "
        f"{scale:.2f} (the reference took {reference:.0f} ms, {REFERENCE_MS:.0f} where the "
        f"budget was set). Largest: {shown}"
    )
