"""Manual optimization: ``training_step`` does its own backward and optimizer steps.

Lightning's way for GANs and other several-optimizer set-ups::

    class GAN(Module):
        automatic_optimization = False

        def training_step(self, batch):
            opt_g, opt_d = self.optimizers()
            d_loss = ...
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            ...
            return g_loss  # optional: shown as ``loss`` (None: no loss in the progress)

        def configure_optimizers(self):
            return [torch.optim.Adam(self.g.parameters()), torch.optim.Adam(self.d.parameters())]

Across ranks there is no DDP wrapper (a backward inside DDP's forward would never reduce):
the module's parameters and buffers are broadcast from rank zero when the fit starts, and each
``opt.step()`` averages the gradients of that optimizer's parameters first, in one
``all_reduce`` per dtype (parameters without a gradient on every rank keep none). That is the
same average DDP computes, without its overlap of communication and backward. A step counts
one ``training_step`` call, however many optimizers it steps (Lightning counts optimizer steps).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..job.ranks import world_size
from .config import TrainerConfig
from .errors import ManualOptimizationInvalid


class ManualOptimizer:
    """An optimizer as ``self.optimizers()`` hands it out; everything else is the optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, owner: ManualOptimization) -> None:
        self.optimizer = optimizer
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        """Average the gradients across ranks, then step (through the scaler under 16-mixed)."""
        self._owner.step(self.optimizer, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


@dataclass(eq=False)
class ManualOptimization:
    """The optimizers, schedulers and scaler of a manual fit; what ``self.optimizers()`` reads."""

    raw: list[torch.optim.Optimizer]
    schedulers: list[Any]
    scaler: torch.amp.GradScaler
    optimizers: list[ManualOptimizer] = field(default_factory=list)
    averaged: set[int] = field(default_factory=set)  # ids of optimizers averaged since a step

    def __post_init__(self) -> None:
        self.optimizers = [ManualOptimizer(o, self) for o in self.raw]

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]

    def step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None) -> None:
        self._average(optimizer)
        self.averaged.discard(id(optimizer))
        if self.scaler.is_enabled():
            self.scaler.step(optimizer)
            self.scaler.update()
        elif closure is None:
            optimizer.step()
        else:
            optimizer.step(closure)

    def clip(self, optimizer: Any, value: float, algorithm: str) -> None:
        opt = getattr(optimizer, "optimizer", optimizer)
        if algorithm not in ("norm", "value"):
            raise ManualOptimizationInvalid(
                f"clip_gradients(gradient_clip_algorithm={algorithm!r}): use 'norm' or 'value'",
                hint="self.clip_gradients(opt, gradient_clip_val=1.0)",
                details={"field": "gradient_clip_algorithm"},
            )
        self._average(opt)  # clip what the step will use: the average over ranks
        if self.scaler.is_enabled():
            self.scaler.unscale_(opt)
        params = [p for group in opt.param_groups for p in group["params"]]
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, value)
        else:
            torch.nn.utils.clip_grad_value_(params, value)

    def _average(self, optimizer: torch.optim.Optimizer) -> None:
        if world_size() <= 1 or id(optimizer) in self.averaged:
            return
        self.averaged.add(id(optimizer))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        average_gradients(params)


def average_gradients(params: Sequence[torch.Tensor]) -> None:
    """Replace each gradient by its mean over ranks: one ``all_reduce`` per dtype.

    A parameter without a gradient counts as zeros; one without a gradient on every rank keeps
    none (so the optimizer skips it, as it would in one process).
    """
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p)
    size = world_size()
    for dtype, group in by_dtype.items():
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group]
            + [torch.tensor([float(p.grad is not None) for p in group], dtype=dtype).to(group[0])]
        )
        dist.all_reduce(flat)
        flags = flat[-len(group) :].tolist()  # one host copy per dtype and step
        offset = 0
        for p, flag in zip(group, flags, strict=True):
            n = p.numel()
            if flag:
                mean = flat[offset : offset + n].view_as(p) / size
                if p.grad is None:
                    p.grad = mean
                else:
                    p.grad.copy_(mean)
            offset += n


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank zero's parameters and buffers on every rank (what DDP does when it wraps)."""
    if world_size() <= 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def setup_manual(
    module: torch.nn.Module, setup: object, config: TrainerConfig, scaler: torch.amp.GradScaler
) -> ManualOptimization:
    """Check the config and split what ``configure_optimizers`` returned, for a manual fit."""
    name = type(module).__name__
    refused = {
        "accumulate": (config.accumulate > 1, "step your optimizers every n batches yourself"),
        "grad_clip": (
            config.grad_clip is not None,
            "call self.clip_gradients(opt, gradient_clip_val=...) before opt.step()",
        ),
        "strategy": (
            config.strategy == "fsdp",
            "use strategy='ddp' (or 'auto'), or automatic optimization with FSDP",
        ),
    }
    for field_name, (bad, hint) in refused.items():
        if bad:
            raise ManualOptimizationInvalid(
                f"{name} sets automatic_optimization = False, which the TrainerConfig's "
                f"{field_name}={getattr(config, field_name)!r} cannot work with: training_step "
                "steps the optimizers itself",
                hint=hint,
                details={"field": field_name},
            )
    optimizers, schedulers = _split(setup)
    if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise ManualOptimizationInvalid(
            f"{name}.configure_optimizers returned {type(setup).__name__}; manual optimization "
            "needs optimizers",
            hint="return an optimizer, a list of optimizers, or ([optimizers], [schedulers])",
            details={"method": "configure_optimizers"},
        )
    return ManualOptimization(list(optimizers), schedulers, scaler)


def _split(setup: object) -> tuple[list[Any], list[Any]]:
    def scheduler(value: object) -> object:
        return value.get("scheduler") if isinstance(value, Mapping) else value

    if isinstance(setup, torch.optim.Optimizer):
        return [setup], []
    if isinstance(setup, Mapping):
        setup = [setup]
    if isinstance(setup, (list, tuple)):
        if (
            len(setup) == 2
            and isinstance(setup[0], (list, tuple))
            and isinstance(setup[1], (list, tuple))
        ):
            return list(setup[0]), [scheduler(s) for s in setup[1]]
        optimizers: list[Any] = []
        schedulers: list[Any] = []
        for item in setup:
            if isinstance(item, Mapping) and "optimizer" in item:
                optimizers.append(item["optimizer"])
                if item.get("lr_scheduler") is not None:
                    schedulers.append(scheduler(item["lr_scheduler"]))
            else:
                optimizers.append(item)
        return optimizers, schedulers
    return [], []
