"""The scheduler benchmark runs (CI smoke size) and prints its figures in the documented shape."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scheduler.py"


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
