"""Callbacks: hooks into a fit, their order, their state in checkpoints, and their failures.

A callback subclasses :class:`Callback` and overrides the hooks it needs; the others are never
called (the Trainer looks up once, per hook, which callbacks override it, so an unused hook
costs nothing per step). Hooks run on every rank, in this order within a fit::

    on_fit_start
      (per optimizer step)   on_train_batch_end
      (per validation)       on_validation_end
      (per epoch's end)      on_train_epoch_end
      (per checkpoint)       on_checkpoint            (before the file is written)
    on_fit_end                                       (after the last checkpoint)
    on_exception                                     (instead of on_fit_end, when fit fails)

Within one hook callbacks run in the order given to the Trainer, then the Trainer's own
:class:`ModelCheckpoint` (last, so that the state it saves includes every other callback's
change at that point, e.g. an EarlyStopping counter). ``state_dict()`` of every callback is
saved in each checkpoint under its ``state_key`` and handed back to ``load_state_dict`` on
resume. A callback that raises stops the fit with :class:`CallbackFailed` naming it and the
hook; checkpoints already written stay as they were.

Hooks get host-side values: ``trainer.metrics`` holds the last *reduced* metrics (floats), so
reading it never syncs the device. ``loss`` in ``on_train_batch_end`` is the device tensor:
calling ``.item()`` on it every step is the per-step sync the Trainer avoids.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from ..errors import GPUlayerError
from ..job.ranks import world_size
from .config import TrainerConfig
from .errors import CallbackFailed

if TYPE_CHECKING:
    from .module import Module


class Trainer(Protocol):
    """What a callback sees of the Trainer (``gpulayer_kernel.torch.Trainer`` is one).

    A protocol rather than the class, so the callbacks' modules need not import the Trainer's.
    """

    config: TrainerConfig
    should_stop: bool  # set it (on every rank) to end the fit after this step
    stop_reason: str | None

    @property
    def step(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def metrics(self) -> dict[str, float | None]: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def validates(self) -> bool: ...
    @property
    def checkpoint_dir(self) -> Path: ...
    def save_checkpoint(self, path: str | Path) -> Path: ...


HOOKS = (
    "on_fit_start",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_validation_end",
    "on_checkpoint",
    "on_fit_end",
    "on_exception",
)


class Callback:
    """Base class of callbacks; every hook is optional and does nothing by default."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in checkpoints; unique per callback of a fit."""
        return type(self).__qualname__

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """Before the first step (after a resume has restored every state)."""

    def on_train_batch_end(
        self, trainer: Trainer, module: Module, loss: torch.Tensor, batch: Any
    ) -> None:
        """After each optimizer step (and its log/validate/checkpoint work); ``loss`` is the
        last micro-batch's loss, still on the device."""

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """When an epoch of the training data has run out (``trainer.epoch`` is the next one)."""

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """After a validation; its results are in ``trainer.metrics`` (``val_*``)."""

    def on_checkpoint(self, trainer: Trainer, module: Module, checkpoint: dict[str, Any]) -> None:
        """Before a checkpoint is written: add plain data (tensors, numbers, str) to it."""

    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        """After the fit ended normally (max steps/epochs/time, or ``should_stop``)."""

    def on_exception(self, trainer: Trainer, module: Module, error: BaseException) -> None:
        """The fit is failing with ``error``; it is raised again after every callback ran."""

    def state_dict(self) -> dict[str, Any]:
        """Plain data (numbers, str, lists, dicts) to save in checkpoints."""
        return {}

    def reads_epoch_metrics(self, validates: bool) -> bool:
        """True when ``on_train_epoch_end`` reads ``trainer.metrics``: the Trainer then reduces
        the metrics at each epoch's end too (an extra report). Default: when it overrides it."""
        return _overrides(self, "on_train_epoch_end")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` saved."""


class CallbackList:
    """The fit's callbacks, dispatched per hook to those that override it."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)
        keys = [cb.state_key for cb in self.callbacks]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            from .errors import CallbackInvalid

            raise CallbackInvalid(
                f"two callbacks share the state key {duplicates[0]!r}; their checkpoint state "
                "would overwrite each other",
                hint="override state_key on one of them (e.g. include its monitor)",
                details={"state_key": duplicates[0]},
            )
        self.by_hook: dict[str, list[Callback]] = {
            hook: [cb for cb in self.callbacks if _overrides(cb, hook)] for hook in HOOKS
        }

    def call(self, hook: str, *args: Any) -> None:
        """Run ``hook`` of every callback overriding it; a failure names the callback."""
        for cb in self.by_hook[hook]:
            try:
                getattr(cb, hook)(*args)
            except GPUlayerError:
                raise  # already names what is wrong (e.g. MetricNotFound from EarlyStopping)
            except Exception as exc:
                name = type(cb).__qualname__
                raise CallbackFailed(
                    f"callback {name}.{hook} raised {type(exc).__name__}: {exc}",
                    hint=f"fix or remove {name}; checkpoints written before this step are "
                    "intact, resume from the last one with fit(..., ckpt_path='last')",
                    details={"callback": name, "hook": hook, "error": type(exc).__name__},
                ) from exc

    def exception(self, trainer: Trainer, module: Module, error: BaseException) -> None:
        """``on_exception`` of each callback; their own failures are reported, not raised."""
        for cb in self.by_hook["on_exception"]:
            try:
                cb.on_exception(trainer, module, error)
            except Exception as exc:  # the fit's own error is the one to raise
                print(
                    f"gpulayer: {type(cb).__qualname__}.on_exception raised {exc!r}",
                    file=sys.stderr,
                )

    def state(self) -> dict[str, Any]:
        return {cb.state_key: cb.state_dict() for cb in self.callbacks}

    def load(self, states: dict[str, Any] | None) -> None:
        for cb in self.callbacks:
            if states and cb.state_key in states:
                cb.load_state_dict(states[cb.state_key])


def _overrides(cb: Callback, hook: str) -> bool:
    return getattr(type(cb), hook, None) is not getattr(Callback, hook)


def rank_zero_decides(flag: bool, device: torch.device) -> bool:
    """Rank zero's ``flag`` on every rank (one tiny broadcast; a no-op for one process).

    Decisions that start collectives (save a checkpoint, stop the fit) must agree across
    ranks, or the ranks deadlock; a metric logged without ``sync_dist`` differs per rank.
    """
    if world_size() <= 1 or not dist.is_initialized():
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item())
