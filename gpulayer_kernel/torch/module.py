"""The model side of the training API: a ``torch.nn.Module`` that says how to train itself."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch.optim.lr_scheduler import LRScheduler

if TYPE_CHECKING:
    from .manual import ManualOptimization
    from .metrics import MetricLog

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
    :meth:`log` records a metric from any step hook without a device sync.
    """

    #: set by the Trainer for the duration of a loop; None: ``log`` is a no-op
    _gl_metrics: MetricLog | None = None
    #: False: ``training_step`` does its own backward and optimizer steps (Lightning's manual
    #: optimization): ``self.optimizers()``, ``self.manual_backward(loss)``, ``opt.step()``
    automatic_optimization: bool = True
    #: set by the Trainer during a fit with ``automatic_optimization = False``
    _gl_manual: ManualOptimization | None = None

    def log(
        self,
        name: str,
        value: torch.Tensor | float,
        prog_bar: bool = False,
        on_step: bool = True,
        on_epoch: bool = False,
        sync_dist: bool = False,
    ) -> None:
        """Record a scalar metric; it stays on the device until the next log boundary.

        ``prog_bar``: also shown in the job's progress (widget, panel, live chart, the text
        line); loggers and ``FitResult.history`` get every metric. ``on_step``: reported every
        ``log_every`` steps as the mean over those steps; ``on_epoch``: the mean over the epoch,
        at its end (both: ``name_step`` and ``name_epoch``). ``sync_dist``: averaged over ranks
        (one ``all_reduce`` per log interval for all such metrics together); otherwise each
        rank keeps its own and rank zero's is shown. Outside a Trainer loop it does nothing.
        """
        metrics = self._gl_metrics
        if metrics is not None:
            metrics.log(name, value, prog_bar, on_step, on_epoch, sync_dist)

    def log_dict(self, values: Mapping[str, torch.Tensor | float], **options: Any) -> None:
        """:meth:`log` each item of ``values`` with the same options."""
        for name, value in values.items():
            self.log(name, value, **options)

    @abc.abstractmethod
    def training_step(self, batch: Any) -> torch.Tensor:
        """Return the scalar loss of one (micro-)batch; the Trainer does backward and the step.

        Return the *mean* over the batch: gradient accumulation and DDP average these means.
        A tensor with one element and a gradient; not a float (``.item()``), not a dict.
        """

    @abc.abstractmethod
    def configure_optimizers(self) -> OptimizerSetup:
        """Return an optimizer over ``self.parameters()``, or ``(optimizer, scheduler)``.

        A bare scheduler steps once per optimizer step; Lightning's scheduler config
        ``{"scheduler": s, "interval": "epoch", "frequency": 1, "monitor": "val_loss"}`` says
        otherwise (``ReduceLROnPlateau`` needs its ``monitor``). Several optimizers (a list, or
        Lightning's ``([optimizers], [schedulers])``) need ``automatic_optimization = False``.
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

    def fsdp_units(self) -> list[torch.nn.Module]:
        """Submodules that ``strategy='fsdp'`` shards as units of their own (default: none).

        Each unit's parameters are gathered just before it runs and freed after, so peak memory
        holds one unit whole at a time; return the repeated blocks (transformer layers). The
        rest is one unit with the module itself.
        """
        return []

    # -- manual optimization (automatic_optimization = False) -------------------------------------

    def _manual(self, what: str) -> ManualOptimization:
        if self._gl_manual is None:
            from .errors import ManualOptimizationInvalid

            raise ManualOptimizationInvalid(
                f"self.{what} works inside training_step of a fit with automatic_optimization "
                f"= False; {type(self).__name__} is not in one",
                hint=f"set automatic_optimization = False on {type(self).__name__} and call "
                f"self.{what} from training_step",
                details={"method": what},
            )
        return self._gl_manual

    def optimizers(self) -> Any:
        """The optimizer(s) ``configure_optimizers`` returned: one, or a list of several.

        Their ``step()`` averages gradients across ranks (and unscales under '16-mixed')."""
        optimizers = self._manual("optimizers()").optimizers
        return optimizers[0] if len(optimizers) == 1 else list(optimizers)

    def lr_schedulers(self) -> Any:
        """The scheduler(s) returned with the optimizers (None: none); step them yourself."""
        schedulers = self._manual("lr_schedulers()").schedulers
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else list(schedulers)

    def manual_backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under '16-mixed'."""
        self._manual("manual_backward()").backward(loss)

    def clip_gradients(
        self, optimizer: Any, gradient_clip_val: float, gradient_clip_algorithm: str = "norm"
    ) -> None:
        """Clip the gradients of ``optimizer``'s parameters (by global norm, or by value)."""
        self._manual("clip_gradients()").clip(optimizer, gradient_clip_val, gradient_clip_algorithm)

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
