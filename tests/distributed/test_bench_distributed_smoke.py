"""The distributed benchmark runs end to end in --quick mode and ends with the ratio line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import ROOT, needs_torch

pytestmark = [pytest.mark.torch, pytest.mark.slow, needs_torch]


@pytest.mark.usefixtures("no_leftovers")
def test_quick_benchmark_prints_the_gang_ratio_last() -> None:
    # One round: this checks the script and its output, not the speed.
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_distributed.py"), "--quick"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"gang/torchrun: \d+\.\d\dx", lines[-1]), lines[-1]
    assert re.fullmatch(r"2-worker gang/torchrun: \d+\.\d\dx", lines[-2]), lines[-2]
    assert any(line.startswith("direct torchrun --nproc-per-node 2: ") for line in lines)
    assert any(line.startswith("machine: ") for line in lines)
