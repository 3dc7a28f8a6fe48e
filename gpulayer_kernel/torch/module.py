"""The model side of the training API: a ``torch.nn.Module`` that says how to train itself."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch.optim.lr_scheduler import LRScheduler

if TYPE_CHECKING:
    pass

OptimizerSetup: TypeAlias = (
    torch.optim.Optimizer
    | tuple[torch.optim.Optimizer, LRScheduler | Mapping[str, Any] | None]
    | Mapping[str, Any]
)
"""What ``configure_optimizers`` returns: an optimizer, ``(optimizer, scheduler)``,
``(optimizer, {"scheduler": s, "interval": "epoch", "monitor": "val_loss"})`` or Lightning's
``{"optimizer": o, "lr_scheduler": ...}``."""


class Module(torch.nn.Module, abc.ABC):
    """A model the :class:`~gpulayer_kernel.torch.Trainer` can train: forward plus a few hooks.

    Subclasses implement ``forward`` as usual, and :meth:`training_step` and
    :meth:`configure_optimizers`; :meth:`validation_step` and :meth:`flops_per_sample` are
    optional. The hooks run on the training device; batches arrive already moved there.
    Call ``self(...)`` (not ``self.forward(...)``) inside the hooks so that DDP, hooks and
    ``torch.compile`` see the call. The Trainer checks what the hooks return (once, up front)
    and raises an error naming the hook, e.g. ``TrainingStepInvalid``, for anything else.
    """

    @abc.abstractmethod
    def training_step(self, batch: Any) -> torch.Tensor:
        """Return the scalar loss of one (micro-)batch; the Trainer does backward and the step.

        Return the *mean* over the batch: gradient accumulation and DDP average these means.
        A tensor with one element and a gradient; not a float (``.item()``), not a dict.
        """

    @abc.abstractmethod
    def configure_optimizers(self) -> OptimizerSetup:
        """Return an optimizer over ``self.parameters()``, or ``(optimizer, scheduler)``.

        A scheduler steps once per optimizer step (not per epoch), without a metric, so
        ``ReduceLROnPlateau`` is refused; so are Lightning's lists and dicts.
        """

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor] | None:
        """Return scalar metrics of one validation batch, e.g. ``{"loss": ..., "acc": ...}``.

        The Trainer averages each over batches and ranks and reports it as ``val_<name>``;
        or call ``self.log("val_acc", acc)`` and return None. Runs under ``torch.no_grad()``
        with the module in eval mode.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define validation_step")

    def test_step(self, batch: Any) -> dict[str, torch.Tensor] | None:
        """Like :meth:`validation_step`, for :meth:`Trainer.test`; reported as ``test_<name>``."""
        raise NotImplementedError(f"{type(self).__name__} does not define test_step")

    def predict_step(self, batch: Any) -> Any:
        """The prediction for one batch, collected by :meth:`Trainer.predict` (default: none)."""
        raise NotImplementedError(f"{type(self).__name__} does not define predict_step")

    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward and backward) per sample, for MFU; None when unknown.

        For a transformer, about ``6 * n_params * seq_len`` plus attention; see docs/trainer.md.
        """
        return None


def has_validation_step(module: Module) -> bool:
    """True when ``module``'s class overrides :meth:`Module.validation_step`."""
    return has_hook(module, "validation_step")


def has_hook(module: Module, name: str) -> bool:
    """True when ``module``'s class overrides the optional hook ``name`` of :class:`Module`."""
    return getattr(type(module), name) is not getattr(Module, name)
