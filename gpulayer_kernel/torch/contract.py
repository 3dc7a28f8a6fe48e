"""Checks of the Module contract: what the hooks return, and whether the data makes one step.

The training checks run once per fit, before or at the first step (``training_step`` on its
first call only), so a wrong return is reported by the hook's name with what to return instead,
not as an ``AttributeError`` deep in the loop; ``validation_step`` is checked per validation
batch, off the training steps. They read only host-side facts (types, shapes,
``requires_grad``), never a tensor's value: no device sync. Lightning-style returns get a hint
naming their GPUlayer equivalent.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from ..job.ranks import world_size
from .config import TrainerConfig
from .data import loader_length, samples_of
from .errors import (
    NoTrainingData,
    OptimizersInvalid,
    SchedulerUnsupported,
    TrainingStepInvalid,
    ValidationStepInvalid,
)

_SETUP_HINT = "return the optimizer, or (optimizer, scheduler)"
_PER_STEP = (
    "; the Trainer steps the scheduler after every optimizer step (Lightning's default is once "
    "per epoch), so size it in optimizer steps"
)
_SCHEDULERS = "CosineAnnealingLR, OneCycleLR, LambdaLR, StepLR"


def check_training_step(value: object, module: torch.nn.Module) -> torch.Tensor:
    """``value`` if it is what ``training_step`` must return: a one-element float tensor with grad.

    Raises :class:`TrainingStepInvalid` naming the method and what it returned.
    """
    method = f"{type(module).__name__}.training_step"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise _bad_step(
                f"{method} returned a tensor of shape {tuple(value.shape)}; the loss must be a "
                "scalar",
                "reduce it to the mean over the batch: loss.mean(), or reduction='mean' "
                "(the default of torch.nn.functional's losses)",
                value,
            )
        if not value.requires_grad:
            kind = "" if value.is_floating_point() else f" {value.dtype}"
            raise _bad_step(
                f"{method} returned a{kind} tensor that does not require grad (detached, "
                "computed under torch.no_grad(), or from parameters that are all frozen)",
                "return the loss computed from self(...) with autograd on: no .detach(), no "
                "torch.no_grad(), and some parameters with requires_grad=True",
                value,
            )
        return value
    if value is None:
        hint = (
            "return the loss tensor, e.g. `return F.cross_entropy(self(x), y)` (a missing return?)"
        )
    elif isinstance(value, Mapping) and isinstance(value.get("loss"), torch.Tensor):
        hint = "return the loss tensor itself: `return out['loss']` (Lightning's dict is not read)"
    elif isinstance(value, numbers.Number):
        hint = "return the loss tensor, not its value: drop the .item() / float(), which also cut "
        hint += "the gradient"
    else:
        hint = "return the scalar loss tensor of the batch (the mean over the batch)"
    raise _bad_step(
        f"{method} returned {_describe(value)}; it must return the loss tensor", hint, value
    )


def check_manual_step(value: object, module: torch.nn.Module) -> torch.Tensor | None:
    """What a manual ``training_step`` returned, if it is None or a one-element tensor.

    With ``automatic_optimization = False`` the step did its own backward; a returned loss is
    only shown (and checked for NaN), so it may be detached.
    """
    if value is None or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return value
    method = f"{type(module).__name__}.training_step"
    raise _bad_step(
        f"{method} (automatic_optimization = False) returned {_describe(value)}; it may return "
        "None or a scalar tensor to show as the loss",
        "return the loss tensor you want in the progress (e.g. the generator's), or nothing",
        value,
    )


def _bad_step(message: str, hint: str, value: object) -> TrainingStepInvalid:
    details = {"method": "training_step", "returned": _describe(value)}
    return TrainingStepInvalid(message, hint=hint, details=details)


def check_validation_step(
    value: object, module: torch.nn.Module, hook: str = "validation_step"
) -> dict[str, torch.Tensor]:
    """``value`` if it is a dict of one-element tensors (None: {}), else ValidationStepInvalid.

    None is allowed for steps that report through ``self.log``; the loop raises when a run
    logged nothing at all. Checked on every evaluation batch: a few type and shape reads.
    """
    method = f"{type(module).__name__}.{hook}"
    if value is None:
        return {}
    if isinstance(value, Mapping):  # {} is allowed: no metrics to report
        bad = {
            key: item
            for key, item in value.items()
            if not (isinstance(key, str) and isinstance(item, torch.Tensor) and item.numel() == 1)
        }
        if not bad:
            return cast(dict[str, torch.Tensor], value)
        key, item = next(iter(bad.items()))
        message = f"{method} returned {{{key!r}: {_describe(item)}}}; each value must be a scalar "
        message += "tensor under a str key"
    else:
        message = f"{method} returned {_describe(value)}; it must return a dict of metrics"
    raise ValidationStepInvalid(
        message,
        hint="return {'loss': loss, 'acc': acc}: str keys, one-element tensors (keep them "
        "tensors: the Trainer averages them on the device); they are reported as "
        f"{'val' if hook == 'validation_step' else 'test'}_<key>; or self.log them and "
        "return None",
        details={"method": hook, "returned": _describe(value)},
    )


def check_optimizers(setup: object, module: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """Split what ``configure_optimizers`` returned into (optimizer, ScheduledLR or None).

    Accepts an optimizer, ``(optimizer, scheduler)``, ``(optimizer, None)``, ``(optimizer,
    lr_scheduler_config)`` and ``{"optimizer": o, "lr_scheduler": scheduler or config}``
    (Lightning's one-optimizer forms). Lists of optimizers raise :class:`OptimizersInvalid`
    with the equivalent return as the hint; a ``ReduceLROnPlateau`` without ``monitor`` raises
    :class:`SchedulerUnsupported`.
    """
    from .scheduling import ScheduledLR, read_config

    method = f"{type(module).__name__}.configure_optimizers"
    details = {"method": "configure_optimizers", "returned": _describe(setup)}
    optimizer: object = None
    scheduler: object = None
    if isinstance(setup, torch.optim.Optimizer):
        optimizer = setup
    elif isinstance(setup, tuple) and len(setup) == 2:
        optimizer, scheduler = setup
    elif isinstance(setup, Mapping) and set(setup) <= {"optimizer", "lr_scheduler"}:
        optimizer, scheduler = setup.get("optimizer"), setup.get("lr_scheduler")
    if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(
        scheduler, torch.optim.Optimizer
    ):
        optimizers, schedulers = _lightning_parts(setup)
        raise OptimizersInvalid(
            f"{method} returned {_describe(setup)}; the Trainer needs an optimizer, or "
            "(optimizer, scheduler)",
            hint=_setup_hint(optimizers, schedulers),
            details=details,
        )
    if scheduler is None:
        return optimizer, None
    if isinstance(scheduler, Mapping) and "scheduler" in scheduler:
        try:
            scheduled = read_config(scheduler)
        except ValueError as exc:
            raise OptimizersInvalid(
                f"{method} returned a scheduler config with {exc}",
                hint="use {'scheduler': s, 'interval': 'step' | 'epoch', 'frequency': 1, "
                "'monitor': 'val_loss'} (monitor only for ReduceLROnPlateau)",
                details=details,
            ) from None
    elif _is_scheduler(scheduler):
        scheduled = ScheduledLR(scheduler)
    else:
        raise OptimizersInvalid(
            f"{method} returned {_describe(setup)}; the second item must be a scheduler",
            hint="return (optimizer, scheduler) with a scheduler from torch.optim.lr_scheduler "
            f"({_SCHEDULERS}), or the optimizer alone",
            details=details,
        )
    if not _is_scheduler(scheduled.scheduler):
        raise OptimizersInvalid(
            f"{method} returned a scheduler config whose 'scheduler' is "
            f"{_describe(scheduled.scheduler)}",
            hint=f"put a scheduler from torch.optim.lr_scheduler there ({_SCHEDULERS})",
            details=details,
        )
    if getattr(scheduled.scheduler, "optimizer", optimizer) is not optimizer:
        raise OptimizersInvalid(
            f"{method} returned a {type(scheduled.scheduler).__name__} built on another "
            f"optimizer than the {type(optimizer).__name__} it returned",
            hint="build the scheduler on the optimizer you return",
            details=details,
        )
    if scheduled.plateau and scheduled.monitor is None:
        raise SchedulerUnsupported(
            f"{method} returned {_describe(setup)}: ReduceLROnPlateau steps on a metric, and "
            "no monitor says which",
            hint="return (optimizer, {'scheduler': plateau, 'monitor': 'val_loss', 'interval': "
            f"'epoch'}}), or a scheduler that needs no metric ({_SCHEDULERS})",
            details=details,
        )
    return optimizer, scheduled


def _is_scheduler(value: object) -> bool:
    # Duck-typed schedulers work as long as they step without arguments and save their state;
    # an optimizer has those methods too, so a pair of optimizers is not mistaken for one.
    if isinstance(value, (LRScheduler, ReduceLROnPlateau)):
        return True
    if isinstance(value, torch.optim.Optimizer):
        return False
    return all(callable(getattr(value, name, None)) for name in ("step", "state_dict"))


def _lightning_parts(setup: object) -> tuple[list[Any], list[Any]]:
    """The optimizers and schedulers inside any of Lightning's return forms (flattened)."""
    optimizers: list[Any] = []
    schedulers: list[Any] = []

    def scheduler(value: object) -> None:  # a scheduler, or Lightning's lr_scheduler_config
        schedulers.append(value.get("scheduler") if isinstance(value, Mapping) else value)

    def visit(value: object, depth: int) -> None:
        if isinstance(value, torch.optim.Optimizer):
            optimizers.append(value)
        elif isinstance(value, Mapping) and "optimizer" in value:
            optimizers.append(value["optimizer"])
            if value.get("lr_scheduler") is not None:
                scheduler(value["lr_scheduler"])
        elif isinstance(value, (list, tuple)) and depth < 2:
            for item in value:  # [optimizers], ([optimizers], [schedulers]), (opt, sched)
                visit(item, depth + 1)
        elif value is not None:
            scheduler(value)

    visit(setup, 0)
    return optimizers, [s for s in schedulers if _is_scheduler(s)]


def _setup_hint(optimizers: list[Any], schedulers: list[Any]) -> str:
    """The GPUlayer return equivalent to what was found, when there is exactly one."""
    if len(optimizers) > 1:
        return (
            "several optimizers need manual optimization: set automatic_optimization = False and "
            "step them in training_step (self.optimizers(), self.manual_backward(loss)); or use "
            "one optimizer with parameter groups, e.g. AdamW([{'params': a}, {'params': b, "
            "'lr': 1e-4}])"
        )
    if len(optimizers) == 1 and not schedulers:
        return "return the optimizer itself"
    if len(optimizers) == 1 and len(schedulers) == 1:
        return "return (optimizer, scheduler)" + _PER_STEP
    return _SETUP_HINT


def check_fit(module: object, val_loader: object, config: TrainerConfig, dev: torch.device) -> None:
    """What ``fit`` refuses before touching anything: not a Module, a val_loader without
    ``validation_step``, '16-mixed' off CUDA."""
    from ..errors import InvalidInput
    from .errors import PrecisionUnsupported
    from .module import Module, has_validation_step

    if not isinstance(module, Module):
        raise InvalidInput(
            f"fit() needs a gpulayer_kernel.torch.Module, got {type(module).__name__}",
            hint="subclass gpulayer_kernel.torch.Module and define training_step and "
            "configure_optimizers",
        )
    if val_loader is not None and not has_validation_step(module):
        raise InvalidInput(
            f"val_loader given but {type(module).__name__} does not define validation_step",
            hint="define validation_step(batch) -> dict[str, Tensor], or drop val_loader",
        )
    if config.precision == "16-mixed" and dev.type != "cuda":
        raise PrecisionUnsupported(
            f"precision '16-mixed' needs a CUDA device; this rank trains on {dev.type}",
            hint="use precision='bf16-mixed' (runs on CPUs and recent GPUs) or '32'",
        )


def check_train_loader(loader: Iterable[Any], config: TrainerConfig) -> None:
    """Raise :class:`NoTrainingData` when ``loader``'s length says no optimizer step can run.

    Loaders without a length are checked by the loop instead (an epoch without a batch).
    """
    batches = loader_length(loader)
    if batches is None:
        return
    batch_size = getattr(loader, "batch_size", None)
    samples = samples_of(loader)
    drop_last = getattr(loader, "drop_last", False) is True
    if batches == 0 and drop_last and isinstance(batch_size, int) and samples:
        where = " on this rank" if world_size() > 1 else ""
        raise NoTrainingData(
            f"train_loader has no batches: batch_size {batch_size} is larger than its "
            f"{samples} samples{where}, and drop_last=True drops the partial batch",
            hint=f"use batch_size <= {samples}, or drop_last=False",
            details={"batch_size": batch_size, "samples": samples},
        )
    if (
        batches
        and config.max_epochs is not None
        and batches * config.max_epochs < config.accumulate
    ):
        raise NoTrainingData(
            f"max_epochs={config.max_epochs} of {batches} batch(es) is fewer micro-batches than "
            f"accumulate={config.accumulate}: not one optimizer step would run",
            hint="lower accumulate or batch_size, or raise max_epochs",
            details={"batches": batches, "accumulate": config.accumulate},
        )


def _describe(value: object, depth: int = 0) -> str:
    """A short picture of a returned value: ``None``, ``a float (0.5)``, ``([SGD], [StepLR])``."""
    if depth == 0 and isinstance(value, (bool, numbers.Number)):
        shown = f"{value:.4g}" if isinstance(value, float) else repr(value)
        return f"{_a(type(value).__name__)} ({shown})"
    if depth == 0 and isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (list, tuple, Mapping)) and depth < 3:
        items = list(value.items() if isinstance(value, Mapping) else value)
        parts = [
            f"{item[0]!r}: {_describe(item[1], depth + 1)}"
            if isinstance(value, Mapping)
            else _describe(item, depth + 1)
            for item in items[:4]
        ] + (["..."] if len(items) > 4 else [])
        inner = ", ".join(parts)
        if isinstance(value, Mapping):
            return "{" + inner + "}"
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner},)" if len(items) == 1 else f"({inner})"
    if value is None:
        return "None"
    return _a(type(value).__name__) if depth == 0 else type(value).__name__


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
