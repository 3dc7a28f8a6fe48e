"""The session benchmark runs end to end (``--quick``: no anchors); its figures are not checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_session.py"

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_bench_session_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("Python API, session call:") for line in lines), lines
    assert any(line.startswith("session cell, server extension:") for line in lines), lines
    assert any(line.startswith("the same cell in the kernel (x += 1; x)") for line in lines), lines
    assert any(line.startswith("a fresh worker's first session") for line in lines), lines
    assert any("2 ranks, warm worker: p50" in line for line in lines), lines
    assert re.fullmatch(r"session/floor ratio: \d+\.\d\d", lines[-1]), lines[-1]
