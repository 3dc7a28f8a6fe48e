"""How a fit spreads its module over ranks: one process, DDP replicas, or FSDP shards.

:func:`make_strategy` picks one from the config and the world size; the loop only calls what
:class:`Strategy` offers (the step, ``no_sync``, the evaluation hooks, the checkpoint's model
and optimizer state, loading them back):

* :class:`Strategy` (one process): the module itself;
* :class:`DDPStrategy`: ``DistributedDataParallel`` around a wrapper whose forward is
  ``training_step`` (so DDP's reducer sees every step), with ``find_unused_parameters`` and
  ``static_graph`` passed through. Parameters outside the loss are named at the first step,
  before an optimizer step could make the replicas differ, and torch's later
  "Expected to have finished reduction" error is translated into the same names;
* :class:`FSDPStrategy`: torch's ``fully_shard`` (FSDP2) on each of ``module.fsdp_units()`` and
  on the same wrapper, so parameters, gradients and optimizer state are sharded across ranks and
  gathered per unit as the step runs. Checkpoints are "full" (gathered to rank zero, one ``.pt``
  like DDP's) or "sharded" (``torch.distributed.checkpoint``: each rank writes its own shards).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..job.ranks import world_size
from .config import TrainerConfig
from .errors import UnusedParameters
from .module import Module


class _Hooks(torch.nn.Module):
    """Routes the wrapper's forward to a hook of the module (``training_step`` by default)."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any, hook: str = "training_step") -> Any:
        return getattr(self.module, hook)(batch)


class Strategy:
    """One process: the module as it is. The base of the distributed strategies."""

    name = "single"

    def __init__(self, module: Module, dev: torch.device, config: TrainerConfig) -> None:
        self.module, self.device, self.config = module, dev, config
        self.train_step: Callable[[Any], Any] = module.training_step

    def no_sync(self) -> AbstractContextManager[Any]:
        """Skip the gradient reduction for an accumulation micro-batch (nothing to skip here)."""
        return nullcontext()

    def hook(self, name: str) -> Callable[[Any], Any]:
        """The callable that runs evaluation hook ``name`` on a batch."""
        fn: Callable[[Any], Any] = getattr(self.module, name)
        return fn

    def before_first_step(self) -> None:
        """Once per fit, after the first backward and before the first optimizer step."""

    def model_state(self) -> dict[str, Any]:
        """The module's state for a checkpoint (collective under FSDP: call on every rank)."""
        return self.module.state_dict()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_model(self, state: dict[str, Any]) -> None:
        """Load a full state dict (a checkpoint's ``model``) into the (maybe sharded) module."""
        self.module.load_state_dict(state)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)


class DDPStrategy(Strategy):
    """Replicas kept equal by DistributedDataParallel's gradient all-reduce."""

    name = "ddp"

    def __init__(self, module: Module, dev: torch.device, config: TrainerConfig) -> None:
        super().__init__(module, dev, config)
        self.ddp = DistributedDataParallel(
            _Hooks(module),
            device_ids=[dev.index] if dev.type == "cuda" else None,
            find_unused_parameters=config.find_unused_parameters,
            static_graph=config.static_graph,
        )
        self.train_step = self._step

    def _step(self, batch: Any) -> Any:
        try:
            return self.ddp(batch)
        except RuntimeError as exc:
            # Raised at the step *after* one whose loss left parameters out (a branch not taken).
            if "Expected to have finished reduction" not in str(exc):
                raise
            found = re.search(r"did not receive grad for rank \d+: ([\d ]+)", str(exc))
            indices = [int(i) for i in found.group(1).split()] if found else []
            names = reducer_names(self.module)
            raise unused_parameters(
                self.module, [names[i] for i in indices if i < len(names)], later=True
            ) from None

    def no_sync(self) -> AbstractContextManager[Any]:
        return self.ddp.no_sync()

    def before_first_step(self) -> None:
        if self.config.find_unused_parameters or self.config.static_graph:
            return  # DDP was told: it marks such parameters ready itself
        unused = [
            name for name, p in self.module.named_parameters() if p.requires_grad and p.grad is None
        ]
        if unused:
            raise unused_parameters(self.module, unused, later=False)


def reducer_names(module: torch.nn.Module) -> list[str]:
    """Names of the parameters in DDP's reducer order (the indices its errors print)."""
    names: list[str] = []
    seen: set[int] = set()
    for module_name, sub in module.named_modules():
        for param_name, p in sub.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                names.append(f"{module_name}.{param_name}" if module_name else param_name)
    return names


def unused_parameters(module: Module, names: list[str], later: bool) -> UnusedParameters:
    """The error naming parameters that took no part in ``training_step``'s loss under DDP."""
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    owner = names[0].rsplit(".", 1)[0] if names and "." in names[0] else None
    freeze = f"module.{owner}.requires_grad_(False)" if owner else "p.requires_grad_(False)"
    when = "in a later step" if later else "in the first step"
    return UnusedParameters(
        f"{type(module).__name__}: parameter(s) {shown or '(unknown)'} took no part in "
        f"training_step's loss {when}, so DDP cannot average their gradients",
        hint="if they should not train, freeze them before fit (" + freeze + "); if some "
        "steps use them and others don't, pass find_unused_parameters=True to the "
        "TrainerConfig (a graph walk per step), or static_graph=True when the same ones are "
        "unused every step",
        details={"parameters": names, "strategy": "ddp"},
    )


class FSDPStrategy(Strategy):
    """Parameters, gradients and optimizer state sharded across ranks by ``fully_shard``."""

    name = "fsdp"

    def __init__(self, module: Module, dev: torch.device, config: TrainerConfig) -> None:
        super().__init__(module, dev, config)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(dev.type, (world_size(),))
        for unit in module.fsdp_units():
            fully_shard(unit, mesh=mesh)
        # The root wraps the hooks, so parameters outside any unit are gathered for the whole
        # step, whatever the step reads (self(...), or a parameter directly).
        self.root: Any = fully_shard(_Hooks(module), mesh=mesh)
        self.train_step = self._step

    def _step(self, batch: Any) -> Any:
        return self.root(batch)

    def no_sync(self) -> AbstractContextManager[Any]:
        return _NoGradientSync(self.root)

    def hook(self, name: str) -> Callable[[Any], Any]:
        def call(batch: Any) -> Any:
            return self.root(batch, name)

        return call

    def _options(self, full: bool) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=full, cpu_offload=full)

    @property
    def full(self) -> bool:
        return self.config.checkpoint_format == "full"

    def model_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state: dict[str, Any] = get_model_state_dict(self.module, options=self._options(self.full))
        return state

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state: dict[str, Any] = get_optimizer_state_dict(
            self.module, optimizer, options=self._options(self.full)
        )
        return state

    def load_model(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, state, options=self._options(True))

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.module, optimizer, state, options=self._options(True))

    def save_sharded(self, optimizer: torch.optim.Optimizer, directory: str) -> None:
        """Each rank writes its shards of the model and optimizer state (collective)."""
        from torch.distributed.checkpoint.state_dict_saver import save

        save(
            {"model": self.model_state(), "optimizer": self.optimizer_state(optimizer)},
            checkpoint_id=directory,
        )

    def load_sharded(self, optimizer: torch.optim.Optimizer, directory: str) -> None:
        """Read this rank's shards (any world size: DCP reshards) into module and optimizer."""
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )
        from torch.distributed.checkpoint.state_dict_loader import load

        state: dict[str, Any] = {
            "model": get_model_state_dict(self.module),
            "optimizer": get_optimizer_state_dict(self.module, optimizer),
        }
        # Partial: a parameter that never had a gradient has no optimizer state in the file,
        # while a fresh optimizer's state dict lists one for every parameter.
        load(state, checkpoint_id=directory, planner=DefaultLoadPlanner(allow_partial_load=True))
        set_model_state_dict(self.module, state["model"])
        set_optimizer_state_dict(self.module, optimizer, state["optimizer"])


class _NoGradientSync:
    """FSDP's ``no_sync``: keep unsharded gradients locally until the last micro-batch."""

    def __init__(self, root: Any) -> None:
        self.root = root

    def __enter__(self) -> None:
        self.root.set_requires_gradient_sync(False)

    def __exit__(self, *exc: Any) -> None:
        self.root.set_requires_gradient_sync(True)


def make_strategy(module: Module, dev: torch.device, config: TrainerConfig) -> Strategy:
    """The strategy ``config.strategy`` asks for at this world size: no process group, the
    module unwrapped; FSDP over any group (one rank of one GPU still shards); else DDP over
    several ranks."""
    if not dist.is_initialized():
        return Strategy(module, dev, config)
    if config.strategy == "fsdp":
        return FSDPStrategy(module, dev, config)
    if world_size() > 1:
        return DDPStrategy(module, dev, config)
    return Strategy(module, dev, config)
