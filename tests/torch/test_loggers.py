"""Loggers: CSV (always), TensorBoard (optional package), your own; FitResult.plot()."""

from __future__ import annotations

import csv
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpulayer_kernel.torch import (  # noqa: E402
    CSVLogger,
    DependencyMissing,
    Logger,
    TensorBoardLogger,
    Trainer,
)
from gpulayer_kernel.torch.testing import LoggingRegressor  # noqa: E402

from .conftest import batches, tiny  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_process")]


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_default_csv_logger_writes_one_row_per_boundary_into_the_job_output(
    single_process: Path,
) -> None:
    torch.manual_seed(0)
    result = Trainer(max_steps=6, log_every=2, val_every=4).fit(
        LoggingRegressor(), batches(), batches(8, seed=1)
    )
    path = single_process / "logs" / "metrics.csv"  # in a job: the artifact logs/metrics.csv
    table = rows(path)
    assert [r["step"] for r in table] == ["2", "4", "6"]
    assert {"loss", "lr", "train_mae_step", "rank", "epoch"} <= set(table[0])
    # val_loss appeared at step 4: the file was rewritten with the new column, row 1 kept.
    assert table[0]["val_loss"] == "" and float(table[1]["val_loss"]) > 0
    assert float(table[-1]["loss"]) == pytest.approx(result.metrics["loss"])
    params = json.loads((path.parent / "hparams.json").read_text())
    assert params["max_steps"] == 6 and params["module"] == "LoggingRegressor"


def test_a_resumed_fit_keeps_the_csv_rows_before_it(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    config = {
        "log_every": 2,
        "checkpoint_every": 4,
        "keep_checkpoints": 3,
        "checkpoint_dir": str(tmp_path),
    }
    Trainer(max_steps=6, loggers=[CSVLogger(logs)], **config).fit(tiny(), batches())
    Trainer(max_steps=8, loggers=[CSVLogger(logs)], **config).fit(
        tiny(), batches(), ckpt_path=tmp_path / "step-00000004.pt"
    )
    assert [r["step"] for r in rows(logs / "metrics.csv")] == ["2", "4", "6", "8"]


class Recording:
    """A logger of one's own: the protocol is three methods."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.metrics: list[tuple[int, dict[str, float | None]]] = []
        self.status = ""

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def finalize(self, status: str) -> None:
        self.status = status


def test_a_logger_of_ones_own_gets_params_metrics_and_the_end() -> None:
    mine = Recording()
    assert isinstance(mine, Logger)
    Trainer(max_steps=4, log_every=2, loggers=[mine]).fit(tiny(), batches())
    assert mine.params["log_every"] == 2 and mine.status == "success"
    assert [step for step, _ in mine.metrics] == [2, 4]
    bad = Recording()
    with pytest.raises(Exception, match="loss is nan"):
        Trainer(max_steps=4, log_every=2, loggers=[bad]).fit(tiny(nan_at_call=1), batches())
    assert bad.status == "failed"


def test_something_that_is_not_a_logger_is_refused() -> None:
    with pytest.raises(Exception, match="is not a logger: it needs log_hyperparams"):
        Trainer(max_steps=1, loggers=[object()])  # type: ignore[list-item]


HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.mark.skipif(
    not HAS_TENSORBOARD,
    reason="the tensorboard package is not installed (pip install 'gpulayer[tensorboard]'; "
    "install.sh --dev installs it)",
)
def test_tensorboard_logger_writes_event_files_tensorboard_reads(single_process: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger()
    torch.manual_seed(0)
    Trainer(max_steps=6, log_every=2, loggers=[logger]).fit(LoggingRegressor(), batches())
    assert logger.log_dir == single_process / "logs" / "tensorboard"
    events = EventAccumulator(str(logger.log_dir))
    events.Reload()
    assert {"loss", "lr", "train_mae_step"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("loss")] == [2, 4, 6]


def test_without_tensorboard_the_logger_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(DependencyMissing) as caught:
        TensorBoardLogger()
    assert caught.value.code == "dependency_missing"
    assert "gpulayer[tensorboard]" in caught.value.hint


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_fit_result_plot_draws_the_history() -> None:
    import matplotlib

    matplotlib.use("Agg")
    torch.manual_seed(0)
    result = Trainer(max_steps=8, log_every=2, val_every=4, loggers=[]).fit(
        LoggingRegressor(), batches(), batches(8, seed=1)
    )
    figure = result.plot()
    left, right = figure.axes
    assert [line.get_label() for line in left.lines] == ["loss", "val_loss"]
    assert [line.get_label() for line in right.lines] == ["train_mae_step", "rank", "val_mae"]
    assert list(left.lines[0].get_xdata()) == [2, 4, 6, 8]
    only = result.plot(["loss"])
    assert len(only.axes) == 1 and [line.get_label() for line in only.axes[0].lines] == ["loss"]
