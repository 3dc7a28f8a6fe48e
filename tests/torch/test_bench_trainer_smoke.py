"""The Trainer benchmark runs end to end in --quick mode and ends with the ratio line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmark_prints_the_with_metrics_ratio_last() -> None:
    # One short round on one thread: this checks the script, not the speed.
    flags = "--quick --rounds 1 --steps 6 --threads 1".split()
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_trainer.py"), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"trainer_with_metrics/raw ratio: \d+\.\d{3}", lines[-1]), lines[-1]
    assert re.fullmatch(r"trainer/raw \(mlp\): \d+\.\d\dx", lines[-2]), lines[-2]
    assert any(line.startswith("mlp: raw loop ") for line in lines)
    assert any(line.startswith("mlp: trainer_with_metrics ") for line in lines)
    assert any(line.startswith("transformer: trainer ") for line in lines)
