"""Training control: early stopping, best-k checkpoints, schedulers, time and batch limits,
fast_dev_run, determinism, test/predict, what ckpt_path accepts, and resuming a changed config."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from gpulayer_kernel.torch import (  # noqa: E402
    CallbackInvalid,
    CheckpointInvalid,
    ConfigChanged,
    EarlyStopping,
    HookMissing,
    MetricNotFound,
    ModelCheckpoint,
    Trainer,
    TrainerConfig,
)
from gpulayer_kernel.torch.testing import LoggingRegressor, TinyRegressor  # noqa: E402

from .conftest import batches, tiny  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_process")]


class Scored(TinyRegressor):
    """Each validation logs the next of ``scores`` as ``val_score`` (one val batch a run)."""

    def __init__(self, scores: list[float], **kwargs: Any) -> None:
        torch.manual_seed(0)
        super().__init__(**kwargs)
        self.scores, self.validations = scores, 0

    def validation_step(self, batch: Any) -> None:  # type: ignore[override]
        self.log("val_score", self.scores[self.validations], prog_bar=True)
        self.validations += 1


VAL = batches(4, 4, seed=1)  # one batch


def fit(model: Any, *callbacks: Any, val: Any = VAL, **config: Any) -> Any:
    config.setdefault("max_steps", 10)
    config.setdefault("val_every", 2)
    return Trainer(callbacks=list(callbacks), loggers=[], **config).fit(model, batches(), val)


# -- early stopping ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "mode", "min_delta", "stopped_at"),
    [
        ([1.0, 0.9, 0.95, 0.91, 0.5, 0.4], "min", 0.0, 8),  # no better than 0.9 twice
        ([1.0, 0.9, 0.95, 0.5, 0.4, 0.3], "min", 0.2, 6),  # 0.9 is not better by 0.2
        ([0.1, 0.2, 0.2, 0.2, 0.9, 1.0], "max", 0.0, 8),
    ],
)
def test_early_stopping_stops_after_patience_checks_without_improvement(
    tmp_path: Path, scores: list[float], mode: Any, min_delta: float, stopped_at: int
) -> None:
    stopper = EarlyStopping("val_score", mode=mode, patience=2, min_delta=min_delta)
    result = fit(Scored(scores), stopper, checkpoint_dir=str(tmp_path))
    assert result.step == stopped_at and stopper.stopped_step == stopped_at
    assert result.stopped is not None
    assert result.stopped.startswith(f"early stopping at step {stopped_at}: val_score did not")
    assert result.checkpoint == tmp_path / f"step-{stopped_at:08d}.pt"  # the end-of-fit save


def test_early_stopping_on_a_metric_never_logged_names_it_and_what_was(tmp_path: Path) -> None:
    with pytest.raises(MetricNotFound) as caught:
        fit(Scored([1.0] * 6), EarlyStopping("val_acc"), checkpoint_dir=str(tmp_path))
    error = caught.value
    assert error.code == "metric_not_found" and error.details["monitor"] == "val_acc"
    assert "EarlyStopping monitors 'val_acc', which was never logged" in error.message
    assert "val_score" in error.message and "loss" in error.details["logged"]
    assert "self.log('val_acc'" in error.hint
    assert not list(tmp_path.glob("*.pt"))  # raised at the first check (step 2), nothing saved


def test_early_stopping_without_validation_checks_at_each_epochs_end() -> None:
    stopper = EarlyStopping("loss", mode="max", patience=1)  # the loss falls: "no improvement"
    result = Trainer(max_epochs=20, callbacks=[stopper], loggers=[], log_every=100).fit(
        tiny(), batches()
    )
    assert result.epoch == 2 and result.step == 20 and stopper.stopped_step == 20


@pytest.mark.parametrize(
    "kwargs", [{"mode": "best"}, {"patience": 0}, {"min_delta": -1.0}], ids=str
)
def test_early_stopping_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(CallbackInvalid):
        EarlyStopping("val_loss", **kwargs)


# -- best-k checkpoints ------------------------------------------------------------------------

SCORES = [0.5, 0.3, 0.4, 0.1, 0.2]  # at steps 2, 4, 6, 8, 10


@pytest.mark.parametrize(
    ("mode", "kept", "best"),
    [("min", [8, 10], 8), ("max", [2, 6], 2)],
)
def test_model_checkpoint_keeps_the_best_k_by_the_metric(
    tmp_path: Path, mode: Any, kept: list[int], best: int
) -> None:
    saver = ModelCheckpoint(tmp_path, monitor="val_score", mode=mode, save_top_k=2, save_last=True)
    result = fit(Scored(SCORES), saver)
    names = sorted(p.name for p in tmp_path.iterdir())
    expected = [f"step-{s:08d}-val_score={SCORES[s // 2 - 1]:.6g}.pt" for s in kept]
    assert names == sorted([*expected, "last.pt"])
    assert result.best_checkpoint == tmp_path / expected[kept.index(best)]
    assert saver.best_model_score == pytest.approx(SCORES[best // 2 - 1])
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    assert last["step"] == 10
    assert last["callbacks"][saver.state_key]["best_k"] == {
        str(tmp_path / n): pytest.approx(SCORES[s // 2 - 1])
        for n, s in zip(expected, kept, strict=True)
    }


def test_best_k_resumes_its_ranking_and_test_loads_the_best(tmp_path: Path) -> None:
    saver = ModelCheckpoint(tmp_path, monitor="val_score", save_top_k=1)
    trainer = Trainer(max_steps=6, val_every=2, callbacks=[saver], loggers=[])
    trainer.fit(Scored(SCORES), batches(), VAL)
    assert [p.name for p in tmp_path.glob("*.pt")] == ["step-00000004-val_score=0.3.pt"]
    resumed = ModelCheckpoint(tmp_path, monitor="val_score", save_top_k=1)
    again = Trainer(max_steps=10, val_every=2, callbacks=[resumed], loggers=[])
    again.fit(Scored(SCORES[2:]), batches(), VAL, ckpt_path=saver.best_model_path)
    assert resumed.best_model_score == pytest.approx(
        0.1
    )  # 0.3 from the first fit's state, then 0.1, 0.2
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["step-00000008-val_score=0.1.pt"]
    model = LoggingRegressor()
    metrics = again.test(model, batches(8, seed=2), ckpt_path="best")
    best = torch.load(tmp_path / "step-00000008-val_score=0.1.pt", weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in best.items())
    assert set(metrics) == {"test_loss"}


def test_save_top_k_with_no_monitor_is_refused() -> None:
    with pytest.raises(CallbackInvalid) as caught:
        ModelCheckpoint(save_top_k=3)
    assert "no monitor" in caught.value.message and "monitor='val_loss'" in caught.value.hint
    assert "keep_newest=3" in caught.value.hint


def test_model_checkpoint_on_a_metric_never_logged(tmp_path: Path) -> None:
    with pytest.raises(MetricNotFound, match="ModelCheckpoint monitors 'val_loss'"):
        fit(Scored(SCORES), ModelCheckpoint(tmp_path, monitor="val_loss"))


# -- schedulers ----------------------------------------------------------------------------------


class Scheduled(Scored):
    def __init__(self, make: Any, scores: list[float] | None = None) -> None:
        super().__init__(scores or [1.0] * 20)
        self.make = make

    def configure_optimizers(self) -> Any:
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return self.optimizer, self.make(self.optimizer)


def test_an_epoch_interval_scheduler_steps_once_per_epoch() -> None:
    step_lr = torch.optim.lr_scheduler.StepLR
    model = Scheduled(lambda o: {"scheduler": step_lr(o, step_size=1, gamma=0.5)})
    result = fit(model, max_steps=None, max_epochs=3, val=None, log_every=10)  # 10 steps/epoch
    lrs = {h["step"]: h["lr"] for h in result.history}
    assert lrs == pytest.approx({10: 0.1, 20: 0.05, 30: 0.025})  # reported before each epoch end
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


def test_reduce_lr_on_plateau_steps_on_the_monitored_metric() -> None:
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
    model = Scheduled(
        lambda o: {"scheduler": plateau(o, patience=0, factor=0.5), "monitor": "val_score"},
        scores=[1.0, 0.5, 0.6, 0.7],  # improves once, then not: two halvings
    )
    fit(model, max_steps=None, max_epochs=4, val_every=None, val_every_epochs=1)
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(0.025)


def test_a_plateau_scheduler_on_a_metric_never_logged_is_named() -> None:
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
    model = Scheduled(lambda o: {"scheduler": plateau(o), "monitor": "val_acc"})
    with pytest.raises(MetricNotFound, match="monitors 'val_acc'.*logged: .*val_score"):
        fit(model, max_steps=None, max_epochs=2, val_every=None, val_every_epochs=1)


# -- limits, dev runs, determinism ---------------------------------------------------------------


class Slow(TinyRegressor):
    def training_step(self, batch: Any) -> torch.Tensor:
        time.sleep(0.01)
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        return super().training_step(batch)


def test_max_time_stops_the_fit_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    result = Trainer(max_steps=10_000, max_time=0.3, loggers=[], checkpoint_at_end=False).fit(
        Slow(), batches()
    )
    assert 1 <= result.step < 10_000
    assert result.stopped is not None and "max_time of 0.3s reached" in result.stopped
    assert "max_time of 0.3s reached" in capsys.readouterr().out


def test_fast_dev_run_runs_one_batch_of_each_and_writes_nothing(tmp_path: Path) -> None:
    model = Scored([1.0])
    result = Trainer(fast_dev_run=True, checkpoint_dir=str(tmp_path)).fit(model, batches(), VAL)
    assert (result.step, model.validations, result.checkpoint) == (1, 1, None)
    assert not any(tmp_path.iterdir()) and not (Path.cwd() / "gpulayer-output").exists()


@pytest.mark.parametrize(("limit", "steps"), [(3, 6), (0.5, 10)])
def test_limit_train_batches_cuts_each_epoch(limit: float, steps: int) -> None:
    result = Trainer(max_epochs=2, limit_train_batches=limit, loggers=[]).fit(tiny(), batches())
    assert (result.step, result.epoch) == (steps, 2)


def test_limit_val_batches_cuts_each_validation() -> None:
    model = Scored([1.0] * 10)
    model.calls = 0
    fit(model, val=batches(12, 4, seed=1), max_steps=4, limit_val_batches=1)
    assert model.validations == 2  # one batch at step 2, one at 4 (of three each time)


def test_deterministic_switches_deterministic_algorithms_on_for_the_fit_only() -> None:
    model = Slow()
    Trainer(max_steps=2, deterministic=True, loggers=[]).fit(model, batches())
    assert model.deterministic is True and not torch.are_deterministic_algorithms_enabled()


# -- test and predict ----------------------------------------------------------------------------


def test_test_and_predict_loops() -> None:
    model = LoggingRegressor()
    trainer = Trainer(max_steps=4, loggers=[])
    trainer.fit(model, batches())
    metrics = trainer.test(model, batches(8, seed=2))
    with torch.no_grad():
        expected = sum(model.test_step(b)["loss"].item() for b in batches(8, seed=2)) / 2
    assert metrics["test_loss"] == pytest.approx(expected, rel=1e-5)
    outputs = trainer.predict(model, batches(8, seed=2))
    assert [tuple(o.shape) for o in outputs] == [(4, 1), (4, 1)] and model.training
    assert set(trainer.validate(model, VAL)) == {"val_loss", "val_mae"}


def test_predict_and_test_without_their_step_are_refused_by_name() -> None:
    with pytest.raises(HookMissing) as caught:
        Trainer(max_steps=1).predict(tiny(), batches())
    assert caught.value.message == (
        "predict() needs TinyRegressor.predict_step, which TinyRegressor does not define"
    )
    assert "define predict_step(self, batch)" in caught.value.hint
    with pytest.raises(HookMissing, match="test_step"):
        Trainer(max_steps=1).test(tiny(), batches())


# -- what ckpt_path accepts, and resuming under a changed config ----------------------------------


def test_ckpt_path_takes_an_artifact_name_of_this_job(
    single_process: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank_dir = single_process / "rank0"  # a gang's rank 0 writes under rank0/
    monkeypatch.setenv("GPULAYER_OUTPUT", str(rank_dir))
    Trainer(max_steps=4, loggers=[]).fit(tiny(), batches())
    for name in ("step-00000004.pt", "rank0/step-00000004.pt"):
        result = Trainer(max_steps=6, loggers=[]).fit(TinyRegressor(), batches(), ckpt_path=name)
        assert result.step == 6


@pytest.mark.parametrize(
    ("ckpt_path", "said"),
    [
        ("best", "no best checkpoint yet"),
        ("last", "ckpt_path='last': no checkpoint in"),
        ("nope.pt", "no checkpoint at nope.pt: no such file or artifact"),
    ],
)
def test_ckpt_path_that_names_nothing(tmp_path: Path, ckpt_path: str, said: str) -> None:
    with pytest.raises(CheckpointInvalid, match=said):
        Trainer(max_steps=2, checkpoint_dir=str(tmp_path / "empty")).fit(
            tiny(), batches(), ckpt_path=ckpt_path
        )


def test_resuming_with_a_changed_config_is_refused_unless_overridden(tmp_path: Path) -> None:
    Trainer(max_steps=4, accumulate=2, checkpoint_dir=str(tmp_path), loggers=[]).fit(
        tiny(), batches()
    )
    saved = tmp_path / "step-00000004.pt"
    model = TinyRegressor()
    before = [p.detach().clone() for p in model.parameters()]
    changed = Trainer(TrainerConfig(max_steps=8, accumulate=4, seed=1), loggers=[])
    with pytest.raises(ConfigChanged) as caught:
        changed.fit(model, batches(), ckpt_path=saved)
    error = caught.value
    assert error.code == "config_changed" and error.status == 409
    assert "accumulate 2 -> 4, seed 0 -> 1" in error.message
    assert "override=('accumulate', 'seed',)" in error.hint
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    result = changed.fit(model, batches(), ckpt_path=saved, override=("accumulate", "seed"))
    assert result.step == 8  # max_steps may change freely
    with pytest.raises(ConfigChanged, match="'acumulate', which resume never checks"):
        changed.fit(model, batches(), ckpt_path=saved, override=("acumulate",))


class FakeTrainer:
    """The Trainer as callbacks see it (the protocol), saving empty files: for invariants."""

    def __init__(self, directory: Path) -> None:
        self.config = TrainerConfig(max_steps=1)
        self.should_stop, self.stop_reason = False, None
        self.step, self.epoch, self.validates = 0, 0, True
        self.metrics: dict[str, float | None] = {}
        self.device = torch.device("cpu")
        self.checkpoint_dir = directory

    def save_checkpoint(self, path: str | Path) -> Path:
        Path(path).write_bytes(b"")
        return Path(path)


@settings(max_examples=40, deadline=None)
@given(
    scores=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=12),
    k=st.integers(-1, 4),
    mode=st.sampled_from(["min", "max"]),
)
def test_best_k_always_keeps_exactly_the_k_best(
    tmp_path_factory: pytest.TempPathFactory, scores: list[float], k: int, mode: Any
) -> None:
    directory = tmp_path_factory.mktemp("best-k")
    saver = ModelCheckpoint(directory, monitor="m", mode=mode, save_top_k=k)
    trainer = FakeTrainer(directory)
    saver.on_fit_start(trainer, None)  # type: ignore[arg-type]
    for step, score in enumerate(scores, 1):
        trainer.step, trainer.metrics = step, {"m": score}
        saver.on_validation_end(trainer, None)  # type: ignore[arg-type]
    ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=mode == "max")
    keep = len(scores) if k < 0 else min(k, len(scores))
    kept = [float(saver.best_k[p]) for p in saver.best_k]
    assert len(saver.best_k) == keep == len(list(directory.iterdir()))
    assert sorted(kept) == sorted(scores[i] for i in ranked[:keep])  # ties: any of equal scores
    if keep:
        assert saver.best_model_score == scores[ranked[0]]
