"""``self.log``: values reduced at log boundaries only, epoch means, names, bad values, no syncs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from gpulayer_kernel.torch import MetricInvalid, Module, Trainer  # noqa: E402
from gpulayer_kernel.torch.metrics import MetricLog  # noqa: E402
from gpulayer_kernel.torch.testing import LoggingRegressor, TinyRegressor  # noqa: E402

from .conftest import batches  # noqa: E402
from .test_trainer import CountingSyncs  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_process")]


class Scripted(TinyRegressor):
    """Logs a known value per step: ``value`` = the 1-based call number, for exact means."""

    def __init__(self, **log: Any) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.options = log

    def training_step(self, batch: Any) -> torch.Tensor:
        loss = super().training_step(batch)
        self.log("value", torch.tensor(float(self.calls)), **self.options)
        self.log("python", 2.5, **self.options)  # Python floats are fine too
        return loss


def fit(model: Module, **config: Any) -> Any:
    config.setdefault("checkpoint_at_end", False)
    return Trainer(loggers=[], **config).fit(model, batches())


def test_on_step_values_are_the_mean_of_each_log_window() -> None:
    result = fit(Scripted(), max_steps=6, log_every=3)
    assert [h["step"] for h in result.history] == [3, 6]
    assert [h["value"] for h in result.history] == [2.0, 5.0]  # mean of 1,2,3 and 4,5,6
    assert result.metrics["python"] == 2.5


def test_on_epoch_values_are_reported_at_each_epochs_end_under_both_names() -> None:
    result = fit(Scripted(on_epoch=True), max_epochs=2, log_every=4)  # 10 steps an epoch
    # The epoch's end reports it (and later reports repeat it until the next epoch's end).
    reported = [h["value_epoch"] for h in result.history if "value_epoch" in h]
    assert list(dict.fromkeys(reported)) == [5.5, 15.5]  # means of calls 1-10 and 11-20
    assert result.history[2] == {**result.history[2], "step": 10, "epoch": 1, "value_epoch": 5.5}
    assert result.history[0]["value_step"] == 2.5 and "value" not in result.history[0]


def test_only_on_epoch_reports_the_plain_name_at_epoch_end() -> None:
    result = fit(Scripted(on_step=False, on_epoch=True), max_epochs=1, log_every=4)
    assert [h.get("value") for h in result.history if "value" in h] == [5.5]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (torch.ones(3), "a tensor of shape (3,)"),
        ("0.5", "a str"),
        ([0.5], "a list"),
        (None, "None"),
        (True, "a bool (True)"),
        ({"a": 1}, "a dict"),
    ],
)
def test_logging_a_non_scalar_or_an_object_names_the_metric(value: Any, said: str) -> None:
    class Bad(TinyRegressor):
        def training_step(self, batch: Any) -> torch.Tensor:
            self.log("acc", value)
            return super().training_step(batch)

    with pytest.raises(MetricInvalid) as caught:
        fit(Bad(), max_steps=2)
    error = caught.value
    assert error.code == "metric_invalid" and error.details["name"] == "acc"
    assert f"self.log('acc', ...) got {said}" in error.message
    assert "one-element tensor" in error.hint


def test_logging_with_neither_on_step_nor_on_epoch_is_refused() -> None:
    with pytest.raises(MetricInvalid, match="would never report it"):
        fit(Scripted(on_step=False), max_steps=2)


def test_log_outside_a_fit_does_nothing() -> None:
    model = LoggingRegressor()
    x, y = batches()[0]
    model.training_step((x, y))  # no Trainer: no error, nothing kept
    assert model._gl_metrics is None


def test_prog_bar_metrics_reach_the_progress_line_others_only_the_history(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    result = Trainer(max_steps=4, log_every=2, loggers=[], checkpoint_at_end=False).fit(
        LoggingRegressor(), batches(), batches(16, seed=1)
    )
    out = capsys.readouterr().out
    assert "train_mae_step" in out and "val_loss" in out  # prog_bar=True
    assert " rank " not in out and "val_mae" not in out  # prog_bar=False
    last = result.history[-1]
    assert {"train_mae_step", "rank", "val_loss", "val_mae"} <= set(last)
    assert last["rank"] == 0.0


class LoggingEveryStep(TinyRegressor):
    """Loss and accuracy-like metrics every step, as the benchmark's "with metrics" rows."""

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        prediction = self(x)
        loss = torch.nn.functional.mse_loss(prediction, y)
        self.log("loss_logged", loss, prog_bar=True)
        self.log("acc", ((prediction - y).abs() < 0.5).float().mean(), prog_bar=True)
        self.log("acc_epoch_mean", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss


def test_self_log_never_syncs_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = batches(8 * 30, 8)
    counts = []
    for steps in (5, 25):
        counter = CountingSyncs(monkeypatch)
        torch.manual_seed(0)
        Trainer(max_steps=steps, log_every=1000, checkpoint_at_end=False, loggers=[]).fit(
            LoggingEveryStep(), data
        )
        counts.append(counter.count)
        monkeypatch.undo()
    assert counts[0] == counts[1]  # 20 more steps with 3 self.log calls each: no more syncs
    assert counts[0] <= 3  # the final reduction's one copy (loss and metrics together)


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40),
    every=st.integers(1, 7),
)
def test_window_means_partition_the_logged_values(values: list[float], every: int) -> None:
    # Invariant: reducing every `every` calls gives the mean of each consecutive window.
    log = MetricLog(torch.device("cpu"))
    got: list[float] = []
    for i, value in enumerate(values, 1):
        log.log("m", torch.tensor(value), False, True, False, False)
        if i % every == 0 or i == len(values):
            got.append(log.reduce()["m"])
    windows = [values[i : i + every] for i in range(0, len(values), every)]
    expected = [sum(w) / len(w) for w in windows]
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-3)
