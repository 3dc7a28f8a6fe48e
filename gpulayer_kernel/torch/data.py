"""Batches in, batches on the device: loaders that shard across ranks and resume mid-epoch.

The data order of an epoch is a function of ``(seed, epoch)`` only, never of the training RNG's
state, so a resumed run can rebuild the epoch's iterator and skip the batches it already
trained on. Two ways to skip:

* a loader made by :func:`distributed_loader` skips by *index* (its sampler starts late): no
  batch is loaded twice. Random augmentations inside DataLoader *worker processes* then restart
  their streams, so bit-for-bit resume needs ``num_workers=0`` or a deterministic dataset;
* any other iterable skips by *loading and dropping* the batches: exact in every case, at the
  cost of loading up to one epoch of batches once at resume.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..job.ranks import rank, world_size


class _ResumableSampler(DistributedSampler[Any]):
    """A DistributedSampler that can start an epoch part-way, so resume loads nothing twice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0

    def __iter__(self) -> Iterator[Any]:
        # One-shot: only the resumed epoch starts late; the next epoch starts at 0 again.
        start, self.start = self.start, 0
        return itertools.islice(super().__iter__(), start, None)


def distributed_loader(
    dataset: Dataset[Any],
    batch_size: int,
    shuffle: bool = True,
    *,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    **kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader that gives this rank its shard of ``dataset``, in an order fixed per epoch.

    Works unchanged in a single process (one shard: the whole dataset). ``batch_size`` is per
    rank. Each rank's shard has the same length: without ``drop_last`` a few samples are
    repeated to even it out. The Trainer calls ``set_epoch`` for you; other loops must call
    ``loader.sampler.set_epoch(epoch)`` at the start of every epoch or each epoch repeats the
    first one's order. ``pin_memory`` defaults to True when CUDA is available.
    """
    sampler = _ResumableSampler(
        dataset,
        num_replicas=world_size(),
        rank=rank(),
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **kwargs,
    )


def epoch_iterator(loader: Iterable[Any], epoch: int, seed: int, skip: int = 0) -> Iterator[Any]:
    """An iterator over epoch ``epoch`` of ``loader``, past its first ``skip`` batches.

    Calls ``set_epoch`` on the loader's sampler when it has one (DDP shuffling needs it). A
    ``RandomSampler`` without a generator draws its order from the global torch RNG; that
    draw happens here under an RNG forked and seeded by ``(seed, epoch)``, so the order does
    not depend on (and does not disturb) the training RNG.
    """
    samplers = _samplers_of(loader)
    for sampler in samplers:
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
    resumable = next((s for s in samplers if isinstance(s, _ResumableSampler)), None)
    batch_size = getattr(loader, "batch_size", None)
    if skip and resumable is not None and isinstance(batch_size, int):
        resumable.start, skip = skip * batch_size, 0
    with torch.random.fork_rng(devices=[]):
        # Only the CPU generator: torch.manual_seed also queues CUDA/XPU/MTIA seeds, and each
        # queued call formats a stack trace (a few tenths of a millisecond per epoch).
        torch.default_generator.manual_seed((seed * 1_000_003 + epoch) % 2**63)
        it = iter(loader)
        # A RandomSampler draws its seed at its first batch, not at iter(): take that batch here.
        head = [] if resumable is not None else list(itertools.islice(it, 1))
    it = itertools.chain(head, it)
    collections.deque(itertools.islice(it, skip), maxlen=0)  # load and drop consumed batches
    return it


def _samplers_of(loader: Iterable[Any]) -> list[Any]:
    found = [getattr(loader, "sampler", None)]
    found.append(getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    unique: list[Any] = []
    for sampler in found:
        if sampler is not None and all(sampler is not other for other in unique):
            unique.append(sampler)
    return unique


def loader_length(loader: Iterable[Any]) -> int | None:
    """``len(loader)`` in batches, or None when it has none (an IterableDataset's loader)."""
    try:
        return len(loader) if isinstance(loader, Sized) else None
    except TypeError:  # a DataLoader is Sized, but over an IterableDataset len() raises
        return None


def samples_of(loader: Iterable[Any]) -> int | None:
    """How many samples one epoch of ``loader`` draws on this rank, when it can tell."""
    for source in (getattr(loader, "sampler", None), getattr(loader, "dataset", None)):
        if isinstance(source, Sized):
            try:
                return len(source)
            except TypeError:
                continue
    return None


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it moved to ``device`` (tensors, tuples, lists, dicts).

    Copies to a CUDA device are asynchronous (``non_blocking``): from pinned memory they
    overlap with compute instead of stalling the host.
    """
    if isinstance(batch, torch.Tensor):
        if batch.device == device:  # skips .to()'s argument parsing: ~2 us a tensor per step
            return batch
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        moved = [to_device(value, device) for value in batch]
        if isinstance(batch, list):
            return moved
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, Mapping):
        return {key: to_device(value, device) for key, value in batch.items()}
    return batch


def batch_size_of(batch: Any) -> int:
    """The number of samples in ``batch``: the first dimension of its first tensor (0 if none).

    Reads a shape, which lives on the host: no device sync.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    values: Iterable[Any] = ()
    if isinstance(batch, Mapping):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    for value in values:
        size = batch_size_of(value)
        if size:
            return size
    return 0
