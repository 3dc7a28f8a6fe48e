"""The scheduler benchmark runs (CI smoke size) and prints its figures in the documented shape."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scheduler.py"


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_benchmark_quick_runs_and_prints_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert re.match(r"full pass: \d+ ms \(jobs=1000 workers=100;", lines[0]), lines[0]
    assert any(line.startswith("growth: ") for line in lines)
    assert any("baseline" in line for line in lines)
    assert re.match(r"one new job: \d+\.\d+ ms \(workers=100,", lines[-1]), lines[-1]


@pytest.mark.slow  # ~7 s with two xdist workers on two cores
def test_benchmark_against_an_earlier_copy_runs_both_and_compares_plans(tmp_path: Path) -> None:
    # This tree's own scheduler as "before": the same plan, and a ratio to print.
    before = tmp_path / "scheduler"
    shutil.copytree(BENCH.parents[1] / "gpulayer_kernel" / "scheduler", before)
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--rounds", "3", "--against", str(before)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert re.match(
        r"full pass against .+, interleaved: cpu \d+ ms vs \d+ ms before \(median per-round "
        r"ratio before / this: \d+\.\d\d; the same plan\)",
        last,
    ), last
