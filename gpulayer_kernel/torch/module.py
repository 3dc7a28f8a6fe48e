"""The model side of the training API: a ``torch.nn.Module`` that says how to train itself."""

from __future__ import annotations

import abc
from typing import Any, TypeAlias

import torch
from torch.optim.lr_scheduler import LRScheduler

OptimizerSetup: TypeAlias = torch.optim.Optimizer | tuple[torch.optim.Optimizer, LRScheduler | None]
"""What ``configure_optimizers`` returns: an optimizer, or an optimizer and its scheduler."""


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

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        """Return scalar metrics of one validation batch, e.g. ``{"loss": ..., "acc": ...}``.

        The Trainer averages each over batches and ranks and reports it as ``val_<name>``.
        Runs under ``torch.no_grad()`` with the module in eval mode.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define validation_step")

    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward and backward) per sample, for MFU; None when unknown.

        For a transformer, about ``6 * n_params * seq_len`` plus attention; see docs/trainer.md.
        """
        return None


def has_validation_step(module: Module) -> bool:
    """True when ``module``'s class overrides :meth:`Module.validation_step`."""
    return type(module).validation_step is not Module.validation_step
