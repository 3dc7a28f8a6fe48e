"""Loggers: where reduced metrics go besides the job's progress (CSV, TensorBoard, your own).

A logger implements :class:`Logger` (three methods). The Trainer calls it on rank zero only,
at log boundaries and epoch ends, with host floats that were reduced anyway: a logger never
adds a device sync. Files default to ``job.output_dir()/logs``, so in a GPUlayer job they come
back as the job's artifacts (``logs/metrics.csv``, ``logs/tensorboard/events...``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .. import job
from .errors import DependencyMissing


@runtime_checkable
class Logger(Protocol):
    """What the Trainer calls on a logger; implement it to send metrics anywhere."""

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Once per fit, before the first step: the TrainerConfig (JSON) and the module's name."""

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        """At each log boundary: metric name -> value (None: not finite or not known)."""

    def finalize(self, status: str) -> None:
        """At the end of the fit: ``"success"`` or ``"failed"``; flush and close files."""


def _logs_dir(save_dir: str | Path | None) -> Path:
    return Path(save_dir) if save_dir is not None else job.output_dir() / "logs"


class CSVLogger:
    """One row per log boundary in ``metrics.csv``; a new metric adds a column (file rewritten).

    A resumed fit keeps the rows before its first step and drops those after, so the file reads
    as one run. Each write is one append and a flush (at log boundaries only).
    """

    def __init__(self, save_dir: str | Path | None = None, name: str = "metrics.csv") -> None:
        self.save_dir, self.name = save_dir, name
        self.path: Path | None = None
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []

    @property
    def log_dir(self) -> Path:
        return _logs_dir(self.save_dir)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self.path = self.log_dir / self.name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        (self.path.parent / "hparams.json").write_text(json.dumps(dict(params), indent=2))
        self.columns, self.rows = [], []

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        if self.path is None:
            self.log_hyperparams({})
        assert self.path is not None
        resumed = not self.rows and self.path.exists()
        if resumed:
            self._keep_earlier_rows(step)
        row = {"step": step, **metrics}
        self.rows.append(row)
        new = [key for key in row if key not in self.columns]
        if new or resumed or not self.path.exists():
            self.columns += new
            self._rewrite()
            return
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(_cells(row))

    def _keep_earlier_rows(self, step: int) -> None:
        assert self.path is not None
        with self.path.open(newline="") as f:
            reader = csv.DictReader(f)
            earlier = [r for r in reader if r.get("step", "").isdigit() and int(r["step"]) < step]
            self.columns = list(reader.fieldnames or [])
        self.rows = [{k: v for k, v in r.items() if v != ""} for r in earlier]

    def _rewrite(self) -> None:
        assert self.path is not None
        partial = self.path.with_name(self.path.name + ".partial")
        with partial.open("w", newline="") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(_cells(r) for r in self.rows)
        partial.replace(self.path)

    def finalize(self, status: str) -> None:
        """Nothing is buffered: every row was written at its boundary."""


def _cells(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: "" if value is None else value for key, value in row.items()}


class TensorBoardLogger:
    """Scalars in TensorBoard event files under ``logs/tensorboard`` (``tensorboard`` package).

    ``tensorboard --logdir gpulayer-output/logs/tensorboard`` shows them; in a job, download the
    ``logs/tensorboard/...`` artifacts first. Needs ``pip install 'gpulayer[tensorboard]'``.
    """

    def __init__(self, save_dir: str | Path | None = None, name: str = "tensorboard") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise DependencyMissing(
                "TensorBoardLogger needs the tensorboard package, which is not installed",
                hint="pip install 'gpulayer[tensorboard]' (or tensorboard), or use CSVLogger",
                details={"package": "tensorboard"},
            ) from None
        self._writer_class = SummaryWriter
        self.save_dir, self.name = save_dir, name
        self.writer: Any = None

    @property
    def log_dir(self) -> Path:
        return _logs_dir(self.save_dir) / self.name

    def _open(self) -> Any:
        if self.writer is None:
            self.writer = self._writer_class(log_dir=str(self.log_dir))
        return self.writer

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        text = json.dumps(dict(params), indent=2)
        self._open().add_text("hparams", f"```\n{text}\n```")

    def log_metrics(self, metrics: Mapping[str, float | None], step: int) -> None:
        writer = self._open()
        for key, value in metrics.items():
            if value is not None:
                writer.add_scalar(key, value, step)
        writer.flush()

    def finalize(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
