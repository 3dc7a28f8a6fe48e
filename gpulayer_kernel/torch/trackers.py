"""Experiment trackers as loggers: Weights & Biases and MLflow, behind the one ``Logger`` protocol.

Both are optional extras (``pip install 'gpulayer[wandb]'``, ``'gpulayer[mlflow]'``) imported
only when a logger is made, so the Trainer never pays for them otherwise. Like every logger they
are called on rank zero, at log boundaries, with host floats the Trainer reduced anyway: no
device sync, and nothing per step.

* :class:`WandbLogger` runs W&B offline by default (``mode="offline"``): the run is written under
  ``save_dir/wandb`` and uploaded later with ``wandb sync DIR``, so a job without a network (or
  an API key) still tracks. ``mode="online"`` logs live.
* :class:`MLflowLogger` logs to a tracking URI; by default a local file store,
  ``file:<save_dir>/mlruns`` (``mlflow ui --backend-store-uri ...`` shows it). MLflow 3 keeps
  that store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``: the
  logger sets that variable for its own default store only (any other URI is yours to choose).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from .errors import DependencyMissing
from .loggers import _logs_dir


def _missing(logger: str, package: str, extra: str) -> DependencyMissing:
    return DependencyMissing(
        f"{logger} needs the {package} package, which is not installed",
        hint=f"pip install 'gpulayer[{extra}]' (or {package}), or use CSVLogger",
        details={"package": package},
    )


class WandbLogger:
    """Metrics and the config as a Weights & Biases run (offline unless told otherwise)."""

    def __init__(
        self,
        project: str = "gpulayer",
        name: str | None = None,
        save_dir: str | Path | None = None,
        mode: Literal["online", "offline", "disabled", "shared"] = "offline",
        **init: Any,
    ) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing("WandbLogger", "wandb", "wandb") from None
        self._wandb = wandb
        self.project, self.name, self.mode, self.init = project, name, mode, init
        self.save_dir = save_dir
        self.run: Any = None

    @property
    def log_dir(self) -> Path:
        return _logs_dir(self.save_dir)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Start the run (one per fit) with the TrainerConfig as its config."""
        self.finalize("success")  # a run left open by an earlier fit
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run = self._wandb.init(
            project=self.project,
            name=self.name,
            dir=str(self.log_dir),
            mode=self.mode,
            config=dict(params),
            **self.init,
        )

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        if self.run is None:
            self.log_hyperparams({})
        values = {key: value for key, value in metrics.items() if value is not None}
        self.run.log(values, step=step)

    def finalize(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "success" else 1)
            self.run = None


class MLflowLogger:
    """Metrics and the config as an MLflow run (a local file store unless told otherwise)."""

    def __init__(
        self,
        experiment: str = "gpulayer",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        save_dir: str | Path | None = None,
    ) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("MLflowLogger", "mlflow", "mlflow") from None
        self.experiment, self.run_name, self.save_dir = experiment, run_name, save_dir
        self.tracking_uri = tracking_uri
        self._client_class = MlflowClient
        self.client: Any = None
        self.run_id: str | None = None

    @property
    def uri(self) -> str:
        """Where runs go: the given tracking URI, else ``file:<logs>/mlruns``."""
        if self.tracking_uri is not None:
            return self.tracking_uri
        return (_logs_dir(self.save_dir) / "mlruns").resolve().as_uri()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Start the run (one per fit); the config's fields become its params (as text)."""
        from mlflow.entities import Param

        self.finalize("success")
        if self.tracking_uri is None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # our own local store
        self.client = self._client_class(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment = (
            found.experiment_id if found else self.client.create_experiment(self.experiment)
        )
        self.run_id = self.client.create_run(experiment, run_name=self.run_name).info.run_id
        # MLflow caps a param's value at 6000 characters and takes at most 100 per batch
        items = [Param(key, str(value)[:6000]) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        from mlflow.entities import Metric

        if self.run_id is None:
            self.log_hyperparams({})
        now = int(time.time() * 1000)
        batch = [
            Metric(key, float(value), now, step)
            for key, value in metrics.items()
            if value is not None
        ]
        self.client.log_batch(self.run_id, metrics=batch)

    def finalize(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, "FINISHED" if status == "success" else "FAILED")
            self.run_id = None
