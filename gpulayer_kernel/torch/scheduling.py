"""When a learning-rate scheduler steps: per optimizer step, per epoch, or on a monitored metric.

``configure_optimizers`` returning ``(optimizer, scheduler)`` steps the scheduler after every
optimizer step (sized in steps, as before). Lightning's scheduler config says more, and is read
as Lightning reads it: ``{"scheduler": s, "interval": "epoch" | "step", "frequency": n,
"monitor": "val_loss"}`` (interval defaults to ``"epoch"`` there, as in Lightning). A
``ReduceLROnPlateau`` needs ``monitor``: it steps with that metric's latest reduced value, which
is a host float already (no extra device sync).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch.optim.lr_scheduler import ReduceLROnPlateau

from .errors import MetricNotFound

Interval = Literal["step", "epoch"]


@dataclass(frozen=True)
class ScheduledLR:
    """A scheduler and when it steps."""

    scheduler: Any  # an LRScheduler, a ReduceLROnPlateau, or a duck-typed one
    interval: Interval = "step"
    frequency: int = 1
    monitor: str | None = None

    @property
    def plateau(self) -> bool:
        return isinstance(self.scheduler, ReduceLROnPlateau)

    def due(self, interval: Interval, count: int) -> bool:
        """True when the scheduler steps at the end of step/epoch number ``count`` (1-based)."""
        return interval == self.interval and count % self.frequency == 0

    def step(self, metrics: Mapping[str, float | None]) -> None:
        """Step once; a monitored scheduler passes the metric's latest value."""
        if self.monitor is None:
            self.scheduler.step()
            return
        value = metrics.get(self.monitor)
        if value is None:
            logged = ", ".join(sorted(k for k, v in metrics.items() if v is not None)) or "none"
            raise MetricNotFound(
                f"the {type(self.scheduler).__name__} scheduler monitors {self.monitor!r}, "
                f"which was not logged before its {self.interval} ended (logged: {logged})",
                hint=f"log it (self.log({self.monitor!r}, value) or return it from "
                "validation_step) before the scheduler steps, validate every epoch "
                "(val_every_epochs=1), or monitor one of the logged names",
                details={"monitor": self.monitor, "logged": logged.split(", ")},
            )
        self.scheduler.step(value)


def read_config(value: Mapping[str, Any]) -> ScheduledLR:
    """A :class:`ScheduledLR` from Lightning's ``lr_scheduler_config`` dict (validated)."""
    interval = value.get("interval", "epoch")
    frequency = value.get("frequency", 1)
    monitor = value.get("monitor")
    if interval not in ("step", "epoch"):
        raise ValueError(f"interval must be 'step' or 'epoch', not {interval!r}")
    if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
        raise ValueError(f"frequency must be a positive int, not {frequency!r}")
    if monitor is not None and not isinstance(monitor, str):
        raise ValueError(f"monitor must be a metric's name, not {monitor!r}")
    return ScheduledLR(value["scheduler"], interval, frequency, monitor)
