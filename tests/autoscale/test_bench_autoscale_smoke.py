"""The autoscaler benchmark runs (CI smoke size) and prints its figures in the documented shape:
the decision's figure, and on the real Slurm (when installed) the cold-start ratio last."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer_kernel.testing import slurm

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_autoscale.py"


@pytest.mark.slow
def test_benchmark_quick_runs_and_prints_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert any(
        re.match(r"one scaling decision: \d+\.\d ms \(1,000 jobs x 20 offers", x) for x in lines
    )
    assert any(x.startswith("baseline (naive") for x in lines)
    if slurm.missing() is None:
        assert any(x.startswith("slurm baseline, sbatch --wrap") for x in lines), lines
        assert re.match(r"slurm cold start ratio \(GPUlayer / sbatch\): \d+\.\d\dx", lines[-1])
    else:
        assert lines[-1].startswith("slurm: skipped")
