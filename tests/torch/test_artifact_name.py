"""The name a Trainer checkpoint comes back under as an artifact (``FitResult.artifact``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpulayer_kernel.torch.checkpoint import artifact_name

pytestmark = pytest.mark.torch


def test_names_are_relative_to_the_jobs_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("GPULAYER_JOB_ID", raising=False)
    monkeypatch.setenv("GPULAYER_OUTPUT", str(tmp_path / "output"))
    assert artifact_name(tmp_path / "output" / "step-1.pt") is None  # not in a job
    monkeypatch.setenv("GPULAYER_JOB_ID", "3f2a1b2c3d4e")
    assert artifact_name(tmp_path / "output" / "ckpt" / "step-1.pt") == "ckpt/step-1.pt"
    assert artifact_name(tmp_path / "elsewhere" / "step-1.pt") is None  # checkpoint_dir


def test_a_gang_ranks_names_carry_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_JOB_ID", "3f2a1b2c3d4e")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("GPULAYER_OUTPUT", str(tmp_path / "output" / "rank0"))
    assert artifact_name(tmp_path / "output" / "rank0" / "step-1.pt") == "rank0/step-1.pt"
