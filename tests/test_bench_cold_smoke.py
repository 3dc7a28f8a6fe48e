"""The cold-start benchmark runs (one round, no anchors) and prints its figure last."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cold.py"


@pytest.mark.slow  # ~6 s: three cold starts, one of them on a machine never probed
def test_bench_cold_quick_prints_the_cold_start_last() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("machine: ")
    for name in ("gpulayer, Python API", "gpulayer run -- true", "first start on this machine"):
        assert any(name in line and re.search(r": \d+ ms \(median of 1;", line) for line in lines)
    assert re.fullmatch(r"cold start, fresh \$GPULAYER_HOME to first result: \d+ ms", lines[-1])
