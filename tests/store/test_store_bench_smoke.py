"""The store benchmark runs (CI smoke size) and prints its figures in the documented shape."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_store.py"


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_benchmark_quick_runs_and_prints_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    sqlite = next(x for x in lines if x.startswith("sqlite: "))
    assert re.match(
        r"sqlite: [\d,]+ transitions/s grouped, one job per writer \(asyncio alone, no store: "
        r"[\d,]+/s\); 50 jobs per writer [\d,]+/s; baseline one by one [\d,]+/s; [\d.]+x$",
        sqlite,
    ), sqlite
    assert re.match(r"transitions/s: sqlite [\d,]+", lines[-1]), lines[-1]
