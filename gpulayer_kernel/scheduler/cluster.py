"""The standing cluster: workers, classes and free capacity, kept and patched between passes.

Every pass needs the workers sorted by id, their profiles, their classes and their free capacity
(``rank.Index``) before it places anything. Built from scratch that is a walk over every worker
and every running job — about 0.6 ms for 1,000 workers, most of what placing *one* new job costs.
Between two passes few workers change (a job started or ended on one or two), so the
``SchedulerCache`` keeps the last ``Cluster`` and each pass asks it for one (``standing``):

* the same ``workers`` tuple as last time: reused as it is (one identity check);
* the same workers in the same order, each the same ``WorkerView`` object or one that differs only
  in what runs on it: reused, and each such worker's free capacity re-derived (``Index.patch``:
  its bucket moves, its class stays);
* anything else (a worker joined, left, changed state, labels, hold, name or capabilities; the
  queue's CPU asks or worker names now split the classes differently): built again.

Each pass places on its own copy of the capacity (``Index.fork``), so the standing copy always
describes the cluster before any placement. What a pass derives this way is exactly what a fresh
build gives (the property tests run passes through a patched cache against fresh ones): the plan
never depends on the cache.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from ..contracts import WorkerCapabilities
from .feasible import (
    Profile,
    WorkerClass,
    class_key,
    label_index,
    same_class_state,
    state_reason,
)
from .memo import Memo
from .model import WorkerView
from .rank import Index

# What the queue contributes to the classes: for each distinct host CPU count, how many of the
# asked CPU counts it holds, as a pattern of "same block as the next one"; and the worker names
# that queued jobs ask for.
Partition = tuple[tuple[bool, ...], frozenset[str]]


@dataclass(slots=True, eq=False)
class Cluster:
    """The workers as passes see them before placing anything (see the module docstring)."""

    given: tuple[WorkerView, ...]  # the snapshot's tuple, in its order
    position: list[int]  # given index -> index in ``workers``
    workers: list[WorkerView]  # sorted by id (shared with ``index``)
    profiles: list[Profile]
    classes: list[WorkerClass]
    class_of: list[WorkerClass]
    index: Index  # free capacity before any placement; each pass forks it
    cpu_asks: tuple[float, ...]  # the asks the classes were split by
    host_cpus: tuple[int, ...]  # the distinct host CPU counts, ascending
    names: frozenset[str]  # worker names in the cluster
    partition: Partition
    _labels: dict[tuple[str, str], set[int]] | None = field(default=None)

    def labels(self) -> dict[tuple[str, str], set[int]]:
        """(key, value) -> workers carrying that label; built when a selector first needs it."""
        if self._labels is None:
            self._labels = label_index([w.labels for w in self.workers])
        return self._labels


def standing(
    last: Cluster | None,
    workers: tuple[WorkerView, ...],
    cpu_asks: Sequence[float],
    names: frozenset[str],
    profiles: Callable[[Sequence[WorkerCapabilities]], list[Profile]],
    picks: Memo[tuple[int, int], int],
) -> Cluster:
    """The cluster for a pass over ``workers`` whose queue asks ``cpu_asks`` (ascending, distinct)
    CPUs and names ``names``: ``last``, patched, when that is the same as building it (then it
    is returned as it is), else a new one (``profiles``: the cache's, ``picks``: its memo)."""
    if last is not None and _same_partition(last, cpu_asks, names):
        if workers is last.given or _patch(last, workers):
            return last
    return _build(workers, tuple(cpu_asks), names, profiles, picks)


def _partition(
    host_cpus: Sequence[int], cpu_asks: Sequence[float], named: frozenset[str]
) -> Partition:
    blocks = [bisect_right(cpu_asks, c) for c in host_cpus]
    return tuple(a == b for a, b in zip(blocks, blocks[1:], strict=False)), named


def _same_partition(last: Cluster, cpu_asks: Sequence[float], names: frozenset[str]) -> bool:
    if tuple(cpu_asks) == last.cpu_asks and names == last.partition[1]:
        return True  # the common case: the same asks as last time
    return _partition(last.host_cpus, cpu_asks, names & last.names) == last.partition


def _patch(last: Cluster, workers: tuple[WorkerView, ...]) -> bool:
    """Bring ``last`` up to ``workers`` if they differ only in what runs; False: build again."""
    given = last.given
    if len(workers) != len(given):
        return False
    changed: list[tuple[int, WorkerView]] = []
    for k, (w, old) in enumerate(zip(workers, given, strict=True)):
        if w is old:
            continue
        if (
            w.id != old.id
            or w.capabilities is not old.capabilities
            or w.name != old.name
            or not same_class_state(w.state, w.hold, old.state, old.hold)
        ):
            return False  # its class may change: rare (membership, capabilities, cordon, hold)
        changed.append((k, w))
    index = last.index
    for k, w in changed:
        i = last.position[k]
        if w.labels != last.workers[i].labels:
            last._labels = None
        if w.running != last.workers[i].running:
            index.patch(i, w)  # also puts ``w`` in ``workers`` (the list is shared)
        else:
            last.workers[i] = w
    last.given = workers
    return True


def _build(
    given: tuple[WorkerView, ...],
    cpu_asks: tuple[float, ...],
    names: frozenset[str],
    derive: Callable[[Sequence[WorkerCapabilities]], list[Profile]],
    picks: Memo[tuple[int, int], int],
) -> Cluster:
    order = sorted(range(len(given)), key=lambda k: given[k].id)
    workers = [given[k] for k in order]
    position = [0] * len(given)
    for i, k in enumerate(order):
        position[k] = i
    classes: dict[tuple[object, ...], WorkerClass] = {}
    class_of: list[WorkerClass] = []
    profiles = derive([w.capabilities for w in workers])
    for i, (w, p) in enumerate(zip(workers, profiles, strict=True)):
        ck = class_key(p, w.state, p.host_cpus, w.name, cpu_asks, names, w.hold)
        cls = classes.get(ck)
        if cls is None:
            name = w.name if w.name in names else None
            why = state_reason(w.state, w.hold)
            cls = WorkerClass(len(classes), p, why, p.host_cpus, name, [])
            classes[ck] = cls
        cls.members.append(i)
        class_of.append(cls)
    host_cpus = tuple(sorted({p.host_cpus for p in profiles}))
    worker_names = frozenset(map(attrgetter("name"), workers))
    return Cluster(
        given=given,
        position=position,
        workers=workers,
        profiles=profiles,
        classes=list(classes.values()),
        class_of=class_of,
        index=Index(workers, profiles, class_of, len(classes), picks),
        cpu_asks=cpu_asks,
        host_cpus=host_cpus,
        names=worker_names,
        partition=_partition(host_cpus, cpu_asks, names & worker_names),
    )
