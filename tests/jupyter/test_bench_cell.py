"""The cell benchmark runs end to end (``--quick``); its figures are not checked here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_cell.py"


@pytest.mark.slow
def test_bench_cell_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("log line, worker print -> notebook client: p50") for line in lines)
    assert re.fullmatch(r"cell/(ipyparallel|bare): \d+\.\d\dx", lines[-1]), lines[-1]
