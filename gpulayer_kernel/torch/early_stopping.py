"""EarlyStopping: end the fit when a monitored metric stops improving.

It checks after every validation, or, when the fit has no validation, at each epoch's end.
A check that improves on the best value by more than ``min_delta`` resets the count; after
``patience`` checks without improvement (or at once on a NaN, with ``check_finite``) it sets
``trainer.should_stop``: the fit ends after that step, with its end-of-fit checkpoint. The
decision is rank zero's, broadcast, so every rank stops at the same step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..job.ranks import print0
from .callbacks import Callback, Trainer, rank_zero_decides
from .errors import CallbackInvalid
from .model_checkpoint import Mode, _not_logged, check_mode

if TYPE_CHECKING:
    from .module import Module


class EarlyStopping(Callback):
    """Stops training after ``patience`` checks of ``monitor`` without improvement."""

    def __init__(
        self,
        monitor: str,
        mode: Mode = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        *,
        check_finite: bool = True,
        verbose: bool = True,
    ) -> None:
        check_mode("EarlyStopping", mode)
        if not isinstance(patience, int) or patience < 1:
            raise CallbackInvalid(
                f"EarlyStopping(patience={patience!r}) must be a positive int",
                hint="patience=3 stops after three checks without improvement",
                details={"field": "patience"},
            )
        if min_delta < 0:
            raise CallbackInvalid(
                f"EarlyStopping(min_delta={min_delta}) must be >= 0 (it is a margin, whatever "
                "the mode)",
                hint="min_delta=0.001",
                details={"field": "min_delta"},
            )
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.check_finite, self.verbose = check_finite, verbose
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.stopped_step: int | None = None
        self.reason: str | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[{self.monitor}]"

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if not trainer.validates:
            self._check(trainer)

    def reads_epoch_metrics(self, validates: bool) -> bool:
        return not validates

    def _check(self, trainer: Trainer) -> None:
        value = trainer.metrics.get(self.monitor)
        if value is None:
            raise _not_logged("EarlyStopping", self.monitor, trainer.metrics)
        reason = None
        if self.check_finite and not math.isfinite(value):
            reason = f"{self.monitor} is {value}"
        elif self.best is None or self._improved(value, self.best):
            self.best, self.best_step, self.wait = value, trainer.step, 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                reason = (
                    f"{self.monitor} did not improve by more than {self.min_delta:g} in "
                    f"{self.wait} checks (best {self.best:.6g} at step {self.best_step})"
                )
        if rank_zero_decides(reason is not None, trainer.device):
            self.stopped_step = trainer.step
            self.reason = reason or f"rank 0 stopped on {self.monitor}"
            trainer.should_stop = True
            trainer.stop_reason = f"early stopping at step {trainer.step}: {self.reason}"
            if self.verbose:
                print0(f"gpulayer: {trainer.stop_reason}")

    def _improved(self, value: float, best: float) -> bool:
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_step": self.best_step,
            "wait": self.wait,
            "stopped_step": self.stopped_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = state.get("best"), state.get("best_step")
        self.wait = int(state.get("wait", 0))
        self.stopped_step = state.get("stopped_step")
