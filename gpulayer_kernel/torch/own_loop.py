"""For people who keep their own loop: accelerate-style helpers that work the same everywhere.

    model, optimizer, loader = prepare(model, optimizer, loader, precision="bf16-mixed",
                                       accumulate=4)
    for epoch in range(3):
        for x, y in loader:                      # batches arrive on the device, sharded
            with accumulate(model):              # no gradient all-reduce on 3 of 4 micro-batches
                loss = F.cross_entropy(model(x), y)  # autocast on, as prepared
                backward(loss)                   # scaled (16-mixed) and divided by 4
                optimizer.step()                 # a no-op until the 4th micro-batch
                optimizer.zero_grad()
        print0("epoch", epoch, gather(loss.detach()).mean().item())
    save_state("ckpt")                           # every prepared object, every rank's RNG

On one CPU, one GPU and DDP ranks alike: ``prepare`` joins the process group torchrun's
variables describe, moves the model to :func:`device`, wraps it in DDP when there are several
ranks, shards a DataLoader across ranks (a DistributedSampler, ``set_epoch`` each epoch) and
moves its batches. The state is per process, like accelerate's ``Accelerator``: one set of
prepared objects at a time. A ``prepare`` call that includes a model starts a new set (what
``save_state`` saves); one without adds to the current set (a loader prepared later).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from ..job.ranks import barrier, device, init_distributed, is_rank_zero, rank, world_size
from .checkpoint import capture_rng, restore_rng, save_checkpoint
from .config import Precision
from .data import to_device
from .errors import CheckpointInvalid, PrecisionUnsupported
from .precision import autocast_for

STATE_FORMAT = "gpulayer.torch.state"


@dataclass
class _State:
    precision: str = "32"
    accumulate: int = 1
    micro: int = 0  # micro-batches seen by accumulate() since the last optimizer step
    sync_gradients: bool = True
    scaler: torch.amp.GradScaler | None = None
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[PreparedOptimizer] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    loaders: list[DeviceLoader] = field(default_factory=list)


_state = _State()


class PreparedOptimizer:
    """An optimizer whose ``step``/``zero_grad`` wait for the accumulation and use the scaler."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        if not _state.sync_gradients:
            return  # an accumulation micro-batch: the step comes with the last one
        if _state.scaler is not None and _state.scaler.is_enabled():
            _state.scaler.step(self.optimizer)
            _state.scaler.update()
        else:
            self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if _state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:  # param_groups, state_dict, ... pass through
        return getattr(self.optimizer, name)


class PreparedScheduler:
    """A scheduler that steps only when the optimizer really stepped (not per micro-batch)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def step(self, *args: Any) -> None:
        if _state.sync_gradients:
            self.scheduler.step(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)


class DeviceLoader:
    """A loader whose batches arrive on the device; calls ``set_epoch`` at each new epoch."""

    def __init__(self, loader: Any, dev: torch.device) -> None:
        self.loader, self.device, self.epoch = loader, dev, 0

    def __iter__(self) -> Iterator[Any]:
        set_epoch = getattr(getattr(self.loader, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        self.epoch += 1
        for batch in self.loader:
            yield to_device(batch, self.device)

    def __len__(self) -> int:
        return len(self.loader)


def prepare(*objects: Any, precision: Precision = "32", accumulate: int = 1) -> Any:
    """Models, optimizers, schedulers and DataLoaders made ready for this process; in order.

    One object gives one back, several a tuple. ``precision`` turns autocast on in the models'
    forward (and a GradScaler for ``16-mixed``, CUDA only); ``accumulate`` micro-batches make
    one optimizer step inside :func:`accumulate`.
    """
    init_distributed()
    dev = device()
    if precision == "16-mixed" and dev.type != "cuda":
        raise PrecisionUnsupported(
            f"precision '16-mixed' needs a CUDA device; this rank runs on {dev.type}",
            hint="use precision='bf16-mixed' (runs on CPUs and recent GPUs) or '32'",
        )
    if any(isinstance(obj, torch.nn.Module) for obj in objects):
        _state.models, _state.optimizers, _state.schedulers, _state.loaders = [], [], [], []
    _state.precision, _state.accumulate, _state.micro = precision, max(1, accumulate), 0
    _state.sync_gradients = True
    _state.scaler = torch.amp.GradScaler(dev.type, enabled=precision == "16-mixed")
    out = [_prepare_one(obj, dev, precision) for obj in objects]
    return out[0] if len(out) == 1 else tuple(out)


def _prepare_one(obj: Any, dev: torch.device, precision: str) -> Any:
    if isinstance(obj, torch.nn.Module):
        obj.to(dev)
        if precision != "32":
            context = autocast_for(precision, dev)
            forward = obj.forward

            @functools.wraps(forward)
            def autocast_forward(*args: Any, **kwargs: Any) -> Any:
                with context():
                    return forward(*args, **kwargs)

            obj.forward = autocast_forward
        model: torch.nn.Module = obj
        if world_size() > 1:
            model = DistributedDataParallel(
                obj, device_ids=[dev.index] if dev.type == "cuda" else None
            )
        _state.models = [m for m in _state.models if unwrap(m) is not obj] + [model]
        return model
    if isinstance(obj, torch.optim.Optimizer):
        prepared = PreparedOptimizer(obj)
        _state.optimizers = [o for o in _state.optimizers if o.optimizer is not obj] + [prepared]
        return prepared
    if isinstance(obj, DataLoader):
        loader = DeviceLoader(_shard(obj), dev)
        _state.loaders.append(loader)
        return loader
    if callable(getattr(obj, "step", None)) and callable(getattr(obj, "state_dict", None)):
        scheduler = PreparedScheduler(obj)
        _state.schedulers.append(scheduler)
        return scheduler
    raise TypeError(
        f"prepare() takes models, optimizers, schedulers and DataLoaders, not {type(obj).__name__}"
    )


def _shard(loader: DataLoader[Any]) -> DataLoader[Any]:
    """The same loader, over this rank's shard of its dataset when there are several ranks."""
    if world_size() <= 1 or isinstance(loader.sampler, DistributedSampler):
        return loader
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=world_size(),
        rank=rank(),
        shuffle=isinstance(loader.sampler, RandomSampler),
        drop_last=loader.drop_last,
    )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
    )


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (itself when not wrapped)."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    assert isinstance(inner, torch.nn.Module)
    return inner


@contextlib.contextmanager
def accumulate(model: torch.nn.Module) -> Iterator[None]:
    """One micro-batch: gradients sync (and the optimizer steps) on every ``accumulate``-th."""
    _state.micro += 1
    _state.sync_gradients = _state.micro % _state.accumulate == 0
    if _state.sync_gradients:
        _state.micro = 0
    no_sync = getattr(model, "no_sync", None)
    context = (
        no_sync() if callable(no_sync) and not _state.sync_gradients else contextlib.nullcontext()
    )
    with context:
        yield


def backward(loss: torch.Tensor) -> None:
    """``loss.backward()``, divided over the accumulation and scaled for ``16-mixed``."""
    if _state.accumulate > 1:
        loss = loss / _state.accumulate
    if _state.scaler is not None and _state.scaler.is_enabled():
        loss = _state.scaler.scale(loss)
    loss.backward()  # type: ignore[no-untyped-call]


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor``, concatenated along dim 0 in rank order (scalars: stacked).

    Collective: every rank must call it. For metrics: ``gather(loss.detach()).mean()``.
    """
    if world_size() <= 1 or not dist.is_initialized():
        return tensor.reshape(1) if tensor.dim() == 0 else tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)


def save_state(directory: str | Path) -> Path:
    """Save every prepared object, the scaler, loader epochs and each rank's RNG: ``state.pt``.

    Collective (the RNG states are gathered); rank zero writes, atomically, and every rank
    returns once the file is there. Loads with ``weights_only=True``, like Trainer checkpoints.
    """
    dev = device()
    rng = capture_rng(dev)
    states: list[Any] = [rng]
    if world_size() > 1:
        states = [None] * world_size()
        dist.all_gather_object(states, rng)
    path = Path(directory) / "state.pt"
    if is_rank_zero():
        state = {
            "format": STATE_FORMAT,
            "version": 1,
            "models": [unwrap(m).state_dict() for m in _state.models],
            "optimizers": [o.optimizer.state_dict() for o in _state.optimizers],
            "schedulers": [s.scheduler.state_dict() for s in _state.schedulers],
            "scaler": _state.scaler.state_dict()
            if _state.scaler and _state.scaler.is_enabled()
            else None,
            "loader_epochs": [loader.epoch for loader in _state.loaders],
            "rng": states,
        }
        save_checkpoint(state, path)
    barrier()
    return path


def load_state(directory: str | Path) -> None:
    """Restore what :func:`save_state` saved into the objects prepared now (same order)."""
    path = Path(directory) / "state.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointInvalid(
            f"no saved state at {path}", hint="pass the directory given to save_state()"
        ) from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointInvalid(
            f"{path} was not written by save_state()",
            hint="load Trainer checkpoints with fit(ckpt_path=...) instead",
        )
    for kind, mine, saved in (
        ("models", _state.models, state["models"]),
        ("optimizers", _state.optimizers, state["optimizers"]),
        ("schedulers", _state.schedulers, state["schedulers"]),
    ):
        if len(mine) != len(saved):
            raise CheckpointInvalid(
                f"{path} holds {len(saved)} {kind}; {len(mine)} are prepared now",
                hint="prepare() the same models, optimizers and schedulers before load_state()",
            )
    for model, weights in zip(_state.models, state["models"], strict=True):
        unwrap(model).load_state_dict(weights)
    for optimizer, saved_state in zip(_state.optimizers, state["optimizers"], strict=True):
        optimizer.optimizer.load_state_dict(saved_state)
    for scheduler, saved_state in zip(_state.schedulers, state["schedulers"], strict=True):
        scheduler.scheduler.load_state_dict(saved_state)
    if state.get("scaler") is not None and _state.scaler is not None:
        _state.scaler.load_state_dict(state["scaler"])
    for loader, epoch in zip(_state.loaders, state.get("loader_epochs", []), strict=False):
        loader.epoch = int(epoch)
    rngs = state["rng"]
    restore_rng(rngs[rank() % len(rngs)], device())
