"""Callbacks: the hook order, their state in checkpoints, a raising callback, bad callbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpulayer_kernel.errors import InvalidInput  # noqa: E402
from gpulayer_kernel.torch import (  # noqa: E402
    Callback,
    CallbackFailed,
    CallbackInvalid,
    Trainer,
    load_checkpoint,
)
from gpulayer_kernel.torch.testing import RecordingCallback  # noqa: E402

from .conftest import batches, tiny  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_process")]


def test_hooks_run_in_the_documented_order(tmp_path: Path) -> None:
    recorder = RecordingCallback()
    trainer = Trainer(
        max_epochs=2,
        log_every=100,
        val_every=5,
        checkpoint_every=10,
        checkpoint_dir=str(tmp_path / "ckpt"),
        callbacks=[recorder],
        loggers=[],
    )
    trainer.fit(tiny(), batches(32, 8), batches(8, 4, seed=1))  # 4 steps an epoch
    calls = recorder.calls
    assert calls[0] == ("on_fit_start", 0) and calls[-1] == ("on_fit_end", 8)
    assert [c for c in calls if c[0] == "on_train_batch_end"] == [
        ("on_train_batch_end", s) for s in range(1, 9)
    ]
    assert [s for h, s in calls if h == "on_validation_end"] == [5, 8]
    assert [s for h, s in calls if h == "on_train_epoch_end"] == [4, 8]
    assert [s for h, s in calls if h == "on_checkpoint"] == [8]  # at the end only (10 > 8)
    # Within step 5: validation (during the step's report) comes before on_train_batch_end.
    assert calls.index(("on_validation_end", 5)) < calls.index(("on_train_batch_end", 5))
    # The final checkpoint is written before on_fit_end.
    assert calls.index(("on_checkpoint", 8)) < calls.index(("on_fit_end", 8))
    assert "on_exception" not in {h for h, _ in calls}


def test_callback_state_is_saved_and_restored_on_resume(tmp_path: Path) -> None:
    first = RecordingCallback()
    Trainer(max_steps=4, callbacks=[first], checkpoint_dir=str(tmp_path), loggers=[]).fit(
        tiny(), batches()
    )
    saved = load_checkpoint(tmp_path / "step-00000004.pt")
    # The state is taken before on_checkpoint and on_fit_end are heard: 1 start + 4 steps.
    assert saved["callbacks"]["RecordingCallback"] == {"calls": 5} and len(first.calls) == 7
    assert "ModelCheckpoint[newest]" in saved["callbacks"]  # the Trainer's own, as a callback

    second = RecordingCallback()
    Trainer(max_steps=6, callbacks=[second], checkpoint_dir=str(tmp_path), loggers=[]).fit(
        tiny(), batches(), ckpt_path=tmp_path / "step-00000004.pt"
    )
    assert second.restored == saved["callbacks"]["RecordingCallback"]
    assert second.calls[0] == ("on_fit_start", 4)  # after the resume put the state back


class Exploding(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer: Any, module: Any, loss: Any, batch: Any) -> None:
        if trainer.step == self.at:
            raise ValueError("boom")


def test_a_raising_callback_fails_the_fit_by_name_and_keeps_the_checkpoints(
    tmp_path: Path,
) -> None:
    recorder = RecordingCallback()
    trainer = Trainer(
        max_steps=10,
        checkpoint_every=4,
        keep_checkpoints=5,
        checkpoint_dir=str(tmp_path),
        callbacks=[recorder, Exploding(at=6)],
        loggers=[],
    )
    with pytest.raises(CallbackFailed) as caught:
        trainer.fit(tiny(), batches())
    error = caught.value
    assert error.code == "callback_failed"
    assert error.message == "callback Exploding.on_train_batch_end raised ValueError: boom"
    assert error.details == {
        "callback": "Exploding",
        "hook": "on_train_batch_end",
        "error": "ValueError",
    }
    assert isinstance(error.__cause__, ValueError)
    assert "ckpt_path='last'" in error.hint
    assert recorder.calls[-1] == ("on_exception", 6)
    # The step-4 checkpoint is intact, and the run resumes from it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004.pt"]
    result = Trainer(max_steps=10, checkpoint_dir=str(tmp_path), loggers=[]).fit(
        tiny(), batches(), ckpt_path="last"
    )
    assert result.step == 10


def test_callbacks_must_be_callbacks_with_distinct_state_keys() -> None:
    with pytest.raises(InvalidInput, match="must subclass gpulayer_kernel.torch.Callback"):
        Trainer(max_steps=1, callbacks=[object()])  # type: ignore[list-item]
    with pytest.raises(CallbackInvalid, match="share the state key 'RecordingCallback'"):
        Trainer(max_steps=1, callbacks=[RecordingCallback(), RecordingCallback()], loggers=[]).fit(
            tiny(), batches()
        )


def test_trainer_takes_config_fields_or_a_config_not_both() -> None:
    from gpulayer_kernel.torch import TrainerConfig

    assert Trainer(max_steps=3).config == TrainerConfig(max_steps=3)
    with pytest.raises(InvalidInput, match="a TrainerConfig and fields"):
        Trainer(TrainerConfig(max_steps=3), log_every=2)
