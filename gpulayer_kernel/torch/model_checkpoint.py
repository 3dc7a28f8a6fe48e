"""ModelCheckpoint: the newest k checkpoints, or the best k by a monitored metric, and last.pt.

Without ``monitor`` it saves every ``every_n_steps`` steps (and/or ``every_n_epochs`` epochs)
and at the end, keeping the newest ``keep_newest`` files: this is what ``TrainerConfig``'s
``checkpoint_every`` / ``keep_checkpoints`` / ``checkpoint_at_end`` build when no
ModelCheckpoint is given. With ``monitor`` it checks after every validation (or, with no
validation, at each epoch's end and at the end of the fit) and keeps the ``save_top_k`` best
files by that metric (``-1``: all); ``save_last`` also keeps ``last.pt``, the newest state.

Every save is a collective (each rank's RNG state is gathered) and the decision to save is
taken on rank zero and broadcast, so ranks never disagree about it. Metrics are reduced just
before each save, so a NaN loss is caught before it reaches a file.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..job.ranks import is_rank_zero
from .callbacks import Callback, Trainer, rank_zero_decides
from .checkpoint import SHARDED_SUFFIX
from .errors import CallbackInvalid, MetricNotFound

if TYPE_CHECKING:
    from .module import Module

Mode = Literal["min", "max"]


class ModelCheckpoint(Callback):
    """Saves checkpoints as it is told; ``best_model_path`` names the best one so far."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        monitor: str | None = None,
        mode: Mode = "min",
        save_top_k: int = 1,
        save_last: bool = False,
        every_n_steps: int | None = None,
        every_n_epochs: int | None = None,
        keep_newest: int = 1,
        save_at_end: bool = True,
    ) -> None:
        _check(monitor, mode, save_top_k, every_n_steps, every_n_epochs, keep_newest)
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.monitor, self.mode, self.save_top_k = monitor, mode, save_top_k
        self.save_last, self.save_at_end = save_last, save_at_end
        self.every_n_steps, self.every_n_epochs = every_n_steps, every_n_epochs
        self.keep_newest = keep_newest
        self.best_k: dict[str, float] = {}  # path -> score, monitored files on disk
        self.newest: list[str] = []  # unmonitored files on disk, oldest first
        self.best_model_path: str | None = None
        self.best_model_score: float | None = None
        self.last_model_path: str | None = None
        self.saved_step = -1
        self.directory = Path(".")

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint[{self.monitor or 'newest'}]"

    # -- when ----------------------------------------------------------------------------------

    def due_at_step(self, step: int) -> bool:
        """True when step ``step`` must save (the Trainer reduces metrics first)."""
        return self.every_n_steps is not None and step % self.every_n_steps == 0

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        self.directory = self.dirpath or trainer.checkpoint_dir

    def at_step(self, trainer: Trainer) -> None:
        self._save_or_check(trainer)

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if self.monitor is not None:
            self._save_or_check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        every = self.every_n_epochs
        if every is not None and trainer.epoch % every == 0:
            self._save_or_check(trainer)
        elif every is None and self.monitor is not None and not trainer.validates:
            self._save_or_check(trainer)

    def reads_epoch_metrics(self, validates: bool) -> bool:
        return self.every_n_epochs is not None or (self.monitor is not None and not validates)

    def at_fit_end(self, trainer: Trainer) -> None:
        """The end-of-fit save (before ``on_fit_end``): once more unless this step saved."""
        if self.save_at_end and self.saved_step != trainer.step:
            self._save_or_check(trainer)

    # -- what ----------------------------------------------------------------------------------

    def _save_or_check(self, trainer: Trainer) -> None:
        step = trainer.step
        suffix = SHARDED_SUFFIX if trainer.config.checkpoint_format == "sharded" else ".pt"
        if self.monitor is None:
            path = self.directory / f"step-{step:08d}{suffix}"
            self._write(trainer, path)
            kept = [p for p in self.newest if p != str(path)] + [str(path)]
            self.newest = self._prune(kept, self.keep_newest)
        else:
            score = self._score(trainer)
            better = rank_zero_decides(self._would_keep(score), trainer.device)
            if better:
                name = f"step-{step:08d}-{_safe(self.monitor)}={score:.6g}{suffix}"
                path = self.directory / name
                self.best_k[str(path)] = score
                doomed = self._over_k()  # out of the state before it is saved in the file
                self._write(trainer, path)
                for old in doomed:
                    if is_rank_zero():
                        _remove(Path(old))
            if self.save_last:
                self._write(trainer, self.directory / f"last{suffix}", last=True)
        self.saved_step = step

    def _write(self, trainer: Trainer, path: Path, last: bool = False) -> None:
        if last:
            self.last_model_path = str(path)
        elif self.monitor is None:
            self.last_model_path = str(path)
        trainer.save_checkpoint(path)

    def _score(self, trainer: Trainer) -> float:
        assert self.monitor is not None
        value = trainer.metrics.get(self.monitor)
        if value is None:
            raise _not_logged("ModelCheckpoint", self.monitor, trainer.metrics)
        return value if math.isfinite(value) else math.inf * (1 if self.mode == "min" else -1)

    def _would_keep(self, score: float) -> bool:
        if self.save_top_k == 0:
            return False
        if self.save_top_k < 0 or len(self.best_k) < self.save_top_k:
            return True
        worst = self._worst()
        return score < self.best_k[worst] if self.mode == "min" else score > self.best_k[worst]

    def _worst(self) -> str:
        pick = max if self.mode == "min" else min
        return pick(self.best_k, key=lambda p: self.best_k[p])

    def _over_k(self) -> list[str]:
        """Take the files beyond the best ``save_top_k`` out of the ranking; return them."""
        doomed = []
        while 0 <= self.save_top_k < len(self.best_k):
            worst = self._worst()
            del self.best_k[worst]
            doomed.append(worst)
        best = (min if self.mode == "min" else max)(self.best_k, key=lambda p: self.best_k[p])
        self.best_model_path, self.best_model_score = best, self.best_k[best]
        return doomed

    def _prune(self, kept: list[str], keep: int) -> list[str]:
        for old in kept[:-keep]:
            if is_rank_zero():
                _remove(Path(old))
        return kept[-keep:]

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "best_k": dict(self.best_k),
            "newest": list(self.newest),
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") != self.monitor:
            return  # another monitor's ranking means nothing to this one
        self.best_k = {str(k): float(v) for k, v in state.get("best_k", {}).items()}
        self.newest = [str(p) for p in state.get("newest", [])]
        self.best_model_path = state.get("best_model_path")
        self.best_model_score = state.get("best_model_score")
        self.last_model_path = state.get("last_model_path")


def _check(
    monitor: str | None,
    mode: str,
    save_top_k: int,
    every_n_steps: int | None,
    every_n_epochs: int | None,
    keep_newest: int,
) -> None:
    check_mode("ModelCheckpoint", mode)
    if monitor is None and save_top_k not in (0, 1):
        raise CallbackInvalid(
            f"ModelCheckpoint(save_top_k={save_top_k}) keeps the best {save_top_k} by a metric, "
            "but no monitor says which metric",
            hint="pass monitor='val_loss' (and mode='min'), or keep_newest="
            f"{max(save_top_k, 1)} to keep the newest files instead",
            details={"field": "save_top_k", "save_top_k": save_top_k},
        )
    if not isinstance(save_top_k, int) or save_top_k < -1:
        raise CallbackInvalid(
            f"ModelCheckpoint(save_top_k={save_top_k!r}): use -1 (all), 0 (none) or k > 0",
            hint="save_top_k=3 keeps the three best",
            details={"field": "save_top_k"},
        )
    for name, value in (("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise CallbackInvalid(
                f"ModelCheckpoint({name}={value!r}) must be a positive int or None",
                hint=f"{name}=500",
                details={"field": name},
            )
    if keep_newest < 1:
        raise CallbackInvalid(
            f"ModelCheckpoint(keep_newest={keep_newest}) must keep at least one file",
            hint="keep_newest=1",
            details={"field": "keep_newest"},
        )


def check_mode(who: str, mode: str) -> None:
    """Raise :class:`CallbackInvalid` unless ``mode`` is ``"min"`` or ``"max"``."""
    if mode not in ("min", "max"):
        raise CallbackInvalid(
            f"{who}(mode={mode!r}): mode must be 'min' or 'max'",
            hint="mode='min' for a loss, mode='max' for an accuracy",
            details={"field": "mode"},
        )


def _remove(path: Path) -> None:
    """Delete a checkpoint: a file, or a sharded checkpoint's directory."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _not_logged(who: str, monitor: str, metrics: dict[str, float | None]) -> MetricNotFound:
    logged = sorted(k for k, v in metrics.items() if v is not None)
    shown = ", ".join(logged) or "nothing yet"
    return MetricNotFound(
        f"{who} monitors {monitor!r}, which was never logged (logged: {shown})",
        hint=f"log it with self.log({monitor!r}, value) (or return it from validation_step as "
        f"{monitor.removeprefix('val_')!r}), or monitor one of the logged names",
        details={"monitor": monitor, "logged": logged},
    )
