"""The soak benchmark at a tiny size, with its mix (chatty jobs, /jobs/run, batches, session cells
on a real worker): it runs end to end and finds no lost, stuck, doubled, wrong or extra work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def test_soak_survives_server_kills() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    argv = [sys.executable, str(SOAK), "--seconds", "5", "--rate", "10", "--workers", "10"]
    argv += ["--kills", "2", "--grace", "30", "--mix", "--chatty-lines", "20000"]
    out = subprocess.run(
        argv, cwd=SOAK.parent, env=env, capture_output=True, text=True, timeout=150
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert re.search(r"acknowledged [1-9]\d*,", out.stdout), out.stdout
    # Session cells ran and came back: with their own values, or (a kill in the middle of one)
    # with the control plane's clear restart error.
    own = re.search(r"mix: \{[^}]*'cell': (\d+)", out.stdout)
    restarted = re.search(r"; (\d+) cells ended with the clear restart error", out.stdout)
    assert restarted, out.stdout
    assert int(own[1] if own else 0) + int(restarted[1]) >= 1, out.stdout
    assert re.fullmatch(r"lost\+stuck\+double\+wrong\+extra = \d+", lines[-1]), out.stdout
    assert lines[-1] == "lost+stuck+double+wrong+extra = 0", out.stdout
