"""A Trainer inside a real GPUlayer job: its checkpoint and logger files come back as artifacts,
and another process resumes from one with ``ckpt_path="JOB_ID:ARTIFACT"``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpulayer_kernel.torch import CheckpointInvalid, Trainer  # noqa: E402
from gpulayer_kernel.torch.testing import TinyRegressor  # noqa: E402

from .conftest import batches  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

GL = [sys.executable, "-m", "gpulayer_kernel.cli"]
TRAIN = """
import torch
from gpulayer_kernel.torch import Trainer
from gpulayer_kernel.torch.testing import LoggingRegressor, regression_data

data = regression_data(40)
batches = [data[i : i + 4] for i in range(0, 40, 4)]
torch.manual_seed(0)
Trainer(max_steps=4, log_every=2).fit(LoggingRegressor(), batches)
"""


def test_job_artifacts_hold_checkpoint_and_logs_and_resume_by_name(
    gl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = subprocess.run(
        [*GL, "run", "--", sys.executable, "-c", TRAIN], capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, run.stderr
    [job] = json.loads(
        subprocess.run([*GL, "jobs", "--json"], capture_output=True, text=True, timeout=60).stdout
    )
    names = {a["name"] for a in job["artifacts"]}
    assert {"step-00000004.pt", "logs/metrics.csv", "logs/hparams.json"} <= names
    assert "train_mae" in run.stdout + run.stderr  # prog_bar metrics in `gpulayer run`'s progress

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID", "GPULAYER_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(max_steps=6, checkpoint_dir=str(tmp_path / "ckpt"), loggers=[])
    result = trainer.fit(TinyRegressor(), batches(), ckpt_path=f"{job['id']}:step-00000004.pt")
    assert result.step == 6  # resumed at 4, trained 2 more
    with pytest.raises(Exception, match="no artifact 'nope.pt'"):
        trainer.fit(TinyRegressor(), batches(), ckpt_path=f"{job['id']}:nope.pt")
    with pytest.raises(CheckpointInvalid, match="no such file or artifact"):
        trainer.fit(TinyRegressor(), batches(), ckpt_path="no-such-thing.pt")
