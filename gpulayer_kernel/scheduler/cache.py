"""The scheduler's memory between passes: what it derived from inputs it will see again.

``schedule(snapshot, cache)`` reads and fills a ``SchedulerCache``; the ControlPlane keeps one for
its life, tests and one-off callers pass none (a fresh one per call). The plan never depends on
what the cache holds: it is memoization only, and a property test checks that a warm cache and a
cold one give the same plan.

What it keeps, and why it pays: the **profile** of each ``WorkerCapabilities`` object (the support
matrix costs more than the rest of a small pass; the ControlPlane hands the same object every
pass), the **shape key** of each ``Resources`` object (a queued job keeps its object between
passes), the GPU verdict per (GPU request, profile), device picks per (free mask, count), report
reason counts and report templates, and the **standing cluster** (cluster.py: the workers sorted
and classed with their free capacity, patched where what runs on a worker changed), which makes
a pass for one new job cost what that job needs rather than a walk over every worker. Per shape
number, its ``Shape`` and what the static checks say of it in the standing cluster
(shapes.py): verdict per class, selector matches, ranking lanes, CPU order, the reports' static
counts; an entry names the cluster and label index it came from and is used only with them.

Bounded: every map is **generational**. A pass starts by turning the current entries into old
ones; each entry the pass uses moves back; the pass ends by dropping the old ones that nothing
used. Between passes the cache holds exactly what the last pass used, however long it lives.

Identity: entries keyed by ``id(obj)`` hold ``obj`` inside the entry and check ``is`` on a hit, so
an id cannot be reused by another object while its entry lives. The small ints that stand for
profile and shape keys come from one counter per cache and are never reused, so an entry keyed by
them can go stale only by never being asked for again (and is then dropped).

One pass at a time: a pass that finds the cache in use by another (a thread still running an
abandoned pass) runs with a fresh cache instead, which gives the same plan.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ..contracts import PlacementReport, Reason, ReasonCount, Resources, WorkerCapabilities
from .cluster import Cluster, standing
from .feasible import (
    Fit,
    Profile,
    Shape,
    derive_profile,
    gpu_fit,
    gpu_value,
    make_shape,
    shape_value,
)
from .memo import Memo
from .model import WorkerView
from .shapes import ShapeInfo


class SchedulerCache:
    """What ``schedule`` remembers between passes; hand the same one to every pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uids = itertools.count(1)  # never reused: see the module docstring
        self._profiles: Memo[int, tuple[WorkerCapabilities, Profile]] = Memo()
        self._profile_uids: dict[tuple[object, ...], int] = {}  # key -> uid of a live profile
        self._shapes: Memo[int, tuple[Resources, tuple[object, ...], int]] = Memo()
        self._shape_uids: dict[tuple[object, ...], int] = {}  # key -> uid of a live shape entry
        self._added = False  # a pass added profiles or shapes: rebuild the uid maps at its end
        self._gpu_uids: Memo[tuple[object, ...], int] = Memo()
        self._gpu_fits: Memo[tuple[int, int], Fit] = Memo()
        self.picks: Memo[tuple[int, int], int] = Memo()  # (free mask, n) -> devices (rank.py)
        self.counts: Memo[tuple[Reason, int, str], ReasonCount] = Memo()  # explain.make_report
        # Report templates and their sentence halves by everything they are made of (reports.py):
        # a queue whose reasons did not change since the last pass builds none of them again.
        self.templates: Memo[tuple[object, ...], tuple[PlacementReport, tuple[str, str]]] = Memo()
        # The last pass's workers, classes and free capacity (cluster.py): one, replaced when a
        # pass cannot patch it, so it is bounded by the cluster's size.
        self.cluster: Cluster | None = None
        # Per shape number: its Shape, and what the static checks say of it in one standing
        # cluster (shapes.py), with that cluster and its label index (None: no selector), so an
        # entry from another cluster, or from before its labels changed, is never used.
        self._shape_objs: Memo[int, tuple[Shape, tuple[object, ...]]] = Memo()  # + gpu_value
        self.infos: Memo[int, tuple[Cluster, object, ShapeInfo]] = Memo()
        self._memos: tuple[Memo[Any, Any], ...] = (
            self._profiles,
            self._shapes,
            self._gpu_uids,
            self._gpu_fits,
            self.picks,
            self.counts,
            self.templates,
            self._shape_objs,
            self.infos,
        )

    def size(self) -> int:
        """Entries held, every map together (tests check the bound with it)."""
        uids = len(self._profile_uids) + len(self._shape_uids)
        return uids + sum(len(m) for m in self._memos) + (self.cluster is not None)

    @contextmanager
    def open_pass(self) -> Iterator[SchedulerCache]:
        """Bracket one pass: yields this cache, or a fresh one while another pass holds this."""
        if not self._lock.acquire(blocking=False):
            yield SchedulerCache()
            return
        try:
            for memo in self._memos:
                memo.begin()
            self._added = False
            yield self
        finally:
            dropped_profiles = self._profiles.end()
            dropped_shapes = self._shapes.end()
            for memo in self._memos[2:]:
                memo.end()
            # Keep each key -> uid map to the keys of live entries, so it is bounded too and a
            # new object equal to a live one gets the live one's uid (one class, one shape).
            # Only when something changed: a steady queue pays nothing here.
            if dropped_profiles or self._added:
                self._profile_uids = {p.key: p.uid for _, p in self._profiles.new.values()}
            if dropped_shapes or self._added:
                self._shape_uids = {key: uid for _, key, uid in self._shapes.new.values()}
            self._lock.release()

    # -- lookups (call inside ``open_pass``) ----------------------------------------------------

    def cluster_for(
        self, workers: tuple[WorkerView, ...], cpu_asks: Sequence[float], names: frozenset[str]
    ) -> Cluster:
        """The standing cluster for this pass's workers and queue (cluster.py): the last one,
        patched, when that is the same as building it."""
        last = self.cluster
        cluster = standing(last, workers, cpu_asks, names, self.profiles, self.picks)
        if cluster is last:
            self._profiles.keep()  # the cluster still uses every profile it holds
        self.cluster = cluster
        return cluster

    def profile(self, caps: WorkerCapabilities) -> Profile:
        """The scheduler's view of ``caps``, derived once per object while it stays in use."""
        return self.profiles([caps])[0]

    def profiles(self, caps: Sequence[WorkerCapabilities]) -> list[Profile]:
        """``profile`` of each, in one call (a pass asks for every worker's at once)."""
        memo = self._profiles
        new, old = memo.new, memo.old
        out: list[Profile] = []
        for c in caps:
            i = id(c)
            hit = new.get(i)
            if hit is None and old:
                hit = old.pop(i, None)
                if hit is not None:
                    new[i] = hit
            if hit is not None and hit[0] is c:
                out.append(hit[1])
                continue
            profile = derive_profile(c)
            uid = self._profile_uids.get(profile.key)
            if uid is None:
                uid = self._profile_uids[profile.key] = next(self._uids)
            profile = replace(profile, uid=uid)
            new[i] = (c, profile)
            self._added = True
            out.append(profile)
        return out

    def shape_key(self, r: Resources) -> tuple[tuple[object, ...], int]:
        """``shape_value(r)`` and a small int standing for it (equal values, equal ints)."""
        return self.shape_keys([r])[0]

    def shape_keys(self, rs: Sequence[Resources]) -> list[tuple[tuple[object, ...], int]]:
        """``shape_key`` of each, in one call (a pass asks for every queued job's at once)."""
        memo = self._shapes
        new, old = memo.new, memo.old
        out: list[tuple[tuple[object, ...], int]] = []
        for r in rs:
            i = id(r)
            hit = new.get(i)
            if hit is None and old:
                hit = old.pop(i, None)
                if hit is not None:
                    new[i] = hit
            if hit is not None and hit[0] is r:
                out.append((hit[1], hit[2]))
                continue
            key = shape_value(r)
            uid = self._shape_uids.get(key)
            if uid is None:
                uid = self._shape_uids[key] = next(self._uids)
            new[i] = (r, key, uid)
            self._added = True
            out.append((key, uid))
        return out

    def shapes(self, rs: Sequence[Resources]) -> list[Shape]:
        """The ``Shape`` of each (``shape`` of its ``shape_key``), in one walk: a pass asks for
        every queued job's, and a queued job keeps its ``Resources`` object between passes."""
        memo = self._shapes
        new, old = memo.new, memo.old
        seen: dict[int, Shape] = {}  # shape number -> its Shape, this call
        out: list[Shape] = []
        for r in rs:
            i = id(r)
            hit = new.get(i)
            if hit is None and old:
                hit = old.pop(i, None)
                if hit is not None:
                    new[i] = hit
            if hit is None or hit[0] is not r:
                key = shape_value(r)
                uid = self._shape_uids.get(key)
                if uid is None:
                    uid = self._shape_uids[key] = next(self._uids)
                hit = new[i] = (r, key, uid)
                self._added = True
            shape = seen.get(hit[2])
            if shape is None:
                shape = seen[hit[2]] = self.shape(r, hit[1], hit[2])
            out.append(shape)
        return out

    def shape(self, r: Resources, key: tuple[object, ...], uid: int) -> Shape:
        """The ``Shape`` of ``r``, whose ``shape_key`` is ``(key, uid)``: one object per number
        while it stays in use (its ``uid`` is that number)."""
        hit = self._shape_objs.get(uid)
        if hit is None:
            gpu_key = gpu_value(r)
            shape = make_shape(r, key, uid, self._gpu_uid(gpu_key))
            self._shape_objs.put(uid, (shape, gpu_key))
            return shape
        # Its GPU number stays in use with it: a later shape asking the same GPUs gets it too.
        self._gpu_uids.get(hit[1])
        return hit[0]

    def gpu_uid(self, r: Resources) -> int:
        """A small int per distinct ``gpu_value(r)``: requests with equal ints get the same GPU
        verdict on a profile."""
        return self._gpu_uid(gpu_value(r))

    def _gpu_uid(self, key: tuple[object, ...]) -> int:
        uid = self._gpu_uids.get(key)
        if uid is None:
            uid = self._gpu_uids.put(key, next(self._uids))
        return uid

    def gpu_fit(self, shape: Shape, profile: Profile) -> Fit:
        """``feasible.gpu_fit``, remembered per (GPU request, profile)."""
        key = (shape.gpu_uid, profile.uid)
        hit = self._gpu_fits.new.get(key)
        if hit is None:
            hit = self._gpu_fits.get(key)
        if hit is None:
            hit = self._gpu_fits.put(key, gpu_fit(shape, profile))
        return hit
