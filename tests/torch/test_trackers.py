"""W&B (offline) and MLflow (a local file store) beside CSV and TensorBoard: one Logger protocol,
one fit writing to all four, each read back with its own package's reader.

The real packages are in the ``dev`` extra, so these run in CI; without them the loggers say
what to install (tested here by hiding the package).
"""

from __future__ import annotations

import csv
import glob
import json
import struct
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if find_spec("wandb") is None or find_spec("mlflow") is None:
    # Found, not imported: W&B and MLflow take ~1 s to import, in every xdist worker that
    # collects this file; the tests that use them import them (the loggers do too).
    pytest.skip("needs wandb and mlflow (the dev extra)", allow_module_level=True)

from gpulayer_kernel.torch import (  # noqa: E402
    CSVLogger,
    DependencyMissing,
    Logger,
    MLflowLogger,
    TensorBoardLogger,
    Trainer,
    WandbLogger,
)
from gpulayer_kernel.torch.testing import LoggingRegressor  # noqa: E402

from .conftest import batches  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    yield
    wandb = sys.modules.get("wandb")  # imported by a logger (None: hidden by the test)
    if wandb is not None:
        wandb.teardown()  # ends W&B's service process: nothing is left running


def wandb_records(run_dir: str) -> Iterator[Any]:
    """The records of an offline run's ``.wandb`` file (W&B's LevelDB-style log of protobufs).

    W&B's service process writes the file, and ``finish`` can return before it has written the
    last records (a fresh-clone run read no exit record): the file is whole once the service has
    ended, which ``teardown`` waits for."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()
    [path] = glob.glob(f"{run_dir}/run-*.wandb")
    data = Path(path).read_bytes()
    assert struct.unpack("<4sHB", data[:7])[0] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # the zero padding at a block's end
            pos += room
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_one_fit_logs_to_csv_tensorboard_wandb_and_mlflow(single_process: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loggers = [CSVLogger(), TensorBoardLogger(), WandbLogger(name="fit"), MLflowLogger()]
    assert all(isinstance(logger, Logger) for logger in loggers), "one protocol for all four"
    torch.manual_seed(0)
    result = Trainer(max_steps=6, log_every=2, loggers=loggers).fit(LoggingRegressor(), batches())
    losses = [(h["step"], h["loss"]) for h in result.history]
    assert [step for step, _ in losses] == [2, 4, 6]

    with (single_process / "logs" / "metrics.csv").open(newline="") as f:
        assert [float(r["loss"]) for r in csv.DictReader(f)] == [loss for _, loss in losses]

    events = EventAccumulator(str(single_process / "logs" / "tensorboard"))
    events.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("loss")] == losses

    [run_dir] = glob.glob(str(single_process / "logs" / "wandb" / "offline-run-*"))
    history, exit_code, config = [], None, {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history.append((record.history.step.num, items["loss"], "train_mae_step" in items))
        elif kind == "exit":
            exit_code = record.exit.exit_code
        elif kind == "run":
            config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
    assert [(step, loss) for step, loss, _ in history] == losses
    assert all(mae for _, _, mae in history), "self.log metrics reach W&B too"
    assert exit_code == 0 and config["max_steps"] in (6, {"value": 6})

    client = MlflowClient(tracking_uri=(single_process / "logs" / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("gpulayer").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["max_steps"] == "6"
    history_ml = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history_ml] == losses
    assert "train_mae_step" in run.data.metrics


def test_a_failed_fit_ends_the_tracker_runs_as_failed(single_process: Path) -> None:
    from mlflow.tracking import MlflowClient

    from gpulayer_kernel.torch import LossNotFinite
    from gpulayer_kernel.torch.testing import TinyRegressor

    loggers = [WandbLogger(), MLflowLogger(experiment="diverges")]
    with pytest.raises(LossNotFinite):
        Trainer(max_steps=4, log_every=2, loggers=loggers).fit(
            TinyRegressor(nan_at_call=1), batches()
        )
    client = MlflowClient(tracking_uri=loggers[1].uri)
    [run] = client.search_runs([client.get_experiment_by_name("diverges").experiment_id])
    assert run.info.status == "FAILED"
    [run_dir] = glob.glob(str(single_process / "logs" / "wandb" / "offline-run-*"))
    records = wandb_records(run_dir)
    exits = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    assert exits == [1]


@pytest.mark.parametrize(
    ("make", "module", "extra"),
    [(WandbLogger, "wandb", "wandb"), (MLflowLogger, "mlflow.tracking", "mlflow")],
)
def test_without_the_package_the_logger_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, make: Any, module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # the import fails, as if not installed
    with pytest.raises(DependencyMissing) as caught:
        make()
    assert caught.value.code == "dependency_missing"
    assert f"gpulayer[{extra}]" in caught.value.hint
