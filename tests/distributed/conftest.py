"""Helpers for distributed (gang) tests: small rank scripts, process checks, job submission."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import Job, JobSpec
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.testing import wait_until

from ..conftest import pid_alive

__all__ = ["pid_alive"]  # re-exported for the tests of this folder

ROOT = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (torchrun needed)")

# Each rank prints its pid first, so a test can check that every rank is gone afterwards.
RANK_PREAMBLE = """\
import os, sys, time
RANK = int(os.environ["RANK"])
print(f"pid {os.getpid()} rank {RANK} world {os.environ['WORLD_SIZE']}", flush=True)
"""

SCRIPTS = {
    # Rank FAIL_RANK raises (a traceback with two frames); every other rank waits for ever.
    "raise_rank.py": RANK_PREAMBLE
    + """
def explode():
    raise ValueError(f"boom in rank {RANK}")
if RANK == int(os.environ.get("FAIL_RANK", "1")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0")))
    explode()
time.sleep(600)
""",
    # Every rank waits for ever (until stopped).
    "sleepy.py": RANK_PREAMBLE + "time.sleep(600)\n",
    # Each rank writes an artifact; rank 0 also sets the result. No torch: quick.
    "outputs.py": RANK_PREAMBLE
    + """
from gpulayer_kernel import job
(job.output_dir() / "hello.txt").write_text(f"from rank {RANK}")
print(f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
job.result({"rank": RANK, "world": int(os.environ["WORLD_SIZE"])})
""",
}


def write_scripts(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for name, text in SCRIPTS.items():
        (where / name).write_text(textwrap.dedent(text))
    return where


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return write_scripts(tmp_path / "scripts")


def command_spec(
    argv: list[str], *, gpus: int, nodes: int = 1, workdir: Path | None = None, **extra: Any
) -> JobSpec:
    return JobSpec.model_validate(
        {
            "workload": {"kind": "command", "argv": argv},
            "resources": {"gpus": gpus, "nodes": nodes},
            "workdir": str(workdir or ROOT),
            **extra,
        }
    )


async def run_to_end(cp: ControlPlane, spec: JobSpec, timeout: float = 90.0) -> Job:
    job = await cp.submit(spec)
    job = await cp.wait(job.id, timeout=timeout)
    assert job.state.terminal, f"job still {job.state.value} after {timeout}s"
    return job


async def lines(cp: ControlPlane, job_id: str) -> list[tuple[str, int | None, str]]:
    page = await cp.logs(job_id, limit=5000)
    return [(r.stream, r.rank, r.text) for r in page.records]


def rank_pids(records: list[tuple[str, int | None, str]]) -> dict[int, int]:
    """rank -> pid, from the "pid P rank R" line every test script prints first."""
    out: dict[int, int] = {}
    for _, rank, text in records:
        if text.startswith("pid ") and rank is not None:
            out[rank] = int(text.split()[1])
    return out


def processes_matching(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line mentions ``marker`` (a test's tmp path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and pid_alive(int(entry)):
            found.append((int(entry), cmd))
    return found


@pytest.fixture
def no_leftovers(tmp_path: Path):  # type: ignore[no-untyped-def]
    """After the test: no process that mentions this test's tmp dir survives (5 s grace)."""
    yield
    marker = str(tmp_path)
    try:
        wait_until(lambda: not processes_matching(marker), 5.0, what="the test's processes to end")
        ok = True
    except TimeoutError:
        ok = False
    left = processes_matching(marker)
    for pid, _ in left:  # do not leak them into the next test, even when failing this one
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert ok, f"processes left behind: {left}"


PY = sys.executable
