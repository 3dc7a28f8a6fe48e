"""benchmarks/bench_fsdp.py runs (one process: a one-rank gloo group that FSDP still shards),
and the Trainer's FSDP ends with the hand-written fully_shard loop's parameters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_fsdp_quick_runs_and_matches_the_hand_written_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["GPULAYER_OUTPUT"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fsdp.py"), "--quick", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fsdp: same parameters as the hand-written loop: yes" in done.stdout
    assert "fsdp: trainer/hand " in done.stdout
