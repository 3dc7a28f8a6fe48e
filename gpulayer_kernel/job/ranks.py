"""Where am I and who are my peers: device and process-group helpers for code inside a job.

The same code runs in a plain notebook (one process, no process group), under ``torchrun`` and as
a GPUlayer distributed job (which sets torchrun's variables: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). Every helper degrades to the single-process
answer when no process group exists, so nothing here needs an ``if distributed:`` at the call site.

Nothing in this module touches CUDA at import time: ``import gpulayer_kernel.torch`` in a kernel
that will fork workers must not create a CUDA context (a forked child cannot use it).

It stands below the Trainer (``gpulayer_kernel.torch`` re-exports every helper) because the
worker's session ranks use it too (``worker/sessions/host.py`` joins the process group with it)
and must not import the Trainer to do so.
"""

from __future__ import annotations

import atexit
import os
import random
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def local_rank() -> int:
    """This process's index among the ranks on its machine (``LOCAL_RANK``; 0 when unset)."""
    return _env_int("LOCAL_RANK", 0)


def rank() -> int:
    """This process's global rank: the process group's when one exists, else ``RANK`` or 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0)


def world_size() -> int:
    """How many ranks train together: the process group's size, else ``WORLD_SIZE`` or 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def is_rank_zero() -> bool:
    """True on the one rank that prints, reports progress and writes checkpoints."""
    return rank() == 0


def device() -> torch.device:
    """The device this rank should compute on: ``cuda:LOCAL_RANK``, else ``mps``, else ``cpu``.

    When a job gives each rank exactly one visible GPU (``CUDA_VISIBLE_DEVICES`` set per rank),
    that GPU is ``cuda:0`` whatever the local rank.
    """
    if torch.cuda.is_available():
        # device_count() reads NVML/the driver without creating a context, so this stays cheap.
        count, index = torch.cuda.device_count(), local_rank()
        if count == 1:
            return torch.device("cuda", 0)
        if index >= count:
            raise RuntimeError(
                f"LOCAL_RANK={index} but only {count} CUDA devices are visible; start at most "
                f"{count} ranks per machine or give each rank its own CUDA_VISIBLE_DEVICES"
            )
        return torch.device("cuda", index)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def init_distributed(backend: str | None = None, timeout: timedelta | None = None) -> bool:
    """Join the process group that torchrun's variables describe; True when training is distributed.

    A no-op returning False for a single process (``WORLD_SIZE`` unset or 1) and idempotent: a
    second call, or a group the caller made itself, is left as it is. ``backend`` defaults to
    NCCL when CUDA is available and gloo otherwise. The group is destroyed at interpreter exit.
    """
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return dist.get_world_size() > 1
    size = _env_int("WORLD_SIZE", 1)
    if size <= 1:
        return False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        # NCCL binds a communicator to the current device; without this every rank uses cuda:0.
        torch.cuda.set_device(device())
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(
        backend, init_method="env://", rank=_env_int("RANK", 0), world_size=size, **kwargs
    )
    atexit.register(destroy_distributed)
    return True


def destroy_distributed() -> None:
    """Leave the process group (a no-op when there is none); safe to call twice."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank gets here; a no-op for a single process."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            # Naming the device avoids NCCL guessing it (and warning about the guess).
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over all ranks, as a new detached tensor (the input is untouched).

    Integer tensors come back as floating point. Every rank must call it, in the same order.
    """
    out = tensor.detach().clone()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return out if out.is_floating_point() else out.to(torch.get_default_dtype())
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / dist.get_world_size()


def print0(*values: Any, **kwargs: Any) -> None:
    """``print`` on rank zero only, flushed, so a job's log shows each line once and at once."""
    if is_rank_zero():
        kwargs.setdefault("flush", True)
        print(*values, **kwargs)


def seed_everything(seed: int) -> None:
    """Seed torch (every device), Python's ``random`` and NumPy (when installed) with ``seed``.

    Call it before building a model whose initial weights must be reproducible; the Trainer
    seeds the training streams itself (with ``seed + rank``).
    """
    random.seed(seed)
    torch.manual_seed(seed)  # also queues the CUDA seed without initialising CUDA
    try:
        import numpy
    except ImportError:  # numpy is optional for the torch extra's users
        return
    numpy.random.seed(seed % 2**32)
