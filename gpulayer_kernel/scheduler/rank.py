"""Stage 2, ranking: among the workers that pass feasibility, which have room now and which is best.

The **index** holds the pass's free capacity: per worker a bit mask of free usable devices, the
free CPU count, and the active reservations (**holds**) on it. Workers of a homogeneous class (all
devices of one kind and memory) sit in **buckets** keyed by ``(class, free GPU count)``, each a
heap of worker indices (= id order), so the tightest fit for ``n`` GPUs is the first non-empty
bucket from ``n`` up: a few dict lookups per class instead of a scan of every worker. Free counts
only fall during a pass, which makes two shortcuts safe: a heap entry is stale exactly when the
worker's count no longer equals the bucket's (dropped when met), and once a class has no bucket
between ``n`` and its ceiling, the ceiling drops to ``n - 1`` for the rest of the pass, so a full
cluster answers "no room" in one comparison per class. Workers that hold reservations, and
classes whose devices differ, are scanned directly; both are few.

Ranking (lower is better); every key ends in the worker index, so ties break on worker id:

* GPU jobs: real before simulated devices, then fewest free GPUs left over on the worker (tightest
  fit, keeping whole machines free for big gangs), then worker id. Within a worker: the shortest
  run of contiguous free indices that fits, else the lowest indices.
* CPU jobs and CPU fallback: CPU-only workers first, then simulated-GPU workers, then the workers
  with fewest GPUs, then worker id; the first with enough free CPUs.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

from .feasible import Fit, Profile, Shape, WorkerClass
from .memo import Memo
from .model import WorkerView

INF = float("inf")
Key = tuple[int, int, int]  # (simulated, GPUs left free, worker index)
Found = tuple[Key, int, int, str | None]  # key, devices to pick from, reserved ones usable, owner
# One class's share of a search: (class id, device mask for the kind choice, simulated 0/1,
# bucketed: homogeneous and the mask is every usable device, members).
Lane = tuple[int, int, int, bool, list[int]]


def lanes(classes: Sequence[tuple[WorkerClass, Fit]], choice: int) -> list[Lane]:
    """The classes with devices for ``choice``, real before simulated (stable otherwise)."""
    out: list[Lane] = []
    for cls, fit in classes:
        m = fit.masks[choice]
        if m:
            p = cls.profile
            bucketed = p.homogeneous and m == p.usable_mask
            out.append((cls.id, m, 1 if p.sim_mask else 0, bucketed, cls.members))
    out.sort(key=lambda lane: lane[2])
    return out


@dataclass(slots=True)
class Hold:
    """An active reservation's devices on one worker."""

    owner: str  # job id
    mask: int
    starts_by: float | None


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """One worker's share of a placement being considered."""

    worker: int  # index
    devices: int  # mask; 0 for CPU placements
    left_free: int  # GPUs left free on the worker afterwards
    via: str | None  # owner of a reservation whose devices this uses (backfill)


class Index:
    """Free devices, CPUs and reservations during one pass, indexed for tightest-fit search."""

    def __init__(
        self,
        workers: list[WorkerView],
        profiles: Sequence[Profile],
        class_of: Sequence[WorkerClass],
        n_classes: int,
        picks: Memo[tuple[int, int], int],
    ) -> None:
        self.picks = picks  # pick_devices per (mask, n): masks repeat within and across passes
        self.workers = workers
        self.profiles = profiles
        self.class_of = class_of
        n = len(workers)
        self.free: list[int] = [0] * n
        self.count: list[int] = [0] * n
        self.cpus: list[float] = [0.0] * n
        self.holds: list[list[Hold] | None] = [None] * n
        self.held_mask: list[int] = [0] * n  # every held device on the worker, whoever holds it
        self.held_by_class: dict[int, list[int]] = {}
        # Per class with holders: no holder has more free GPUs than held_free, nor more free
        # ones nobody holds than held_room. Upper bounds (capacity only falls in a pass, and a
        # new holder raises them): a search for more skips the holders in one comparison.
        self.held_free: dict[int, int] = {}
        self.held_room: dict[int, int] = {}
        # buckets[class id][free count]: a heap of worker indices (a list per count, not a dict
        # keyed by tuples: the search reads it in its innermost loop).
        self.buckets: list[list[list[int]]] = [[] for _ in range(n_classes)]
        self.ceiling: list[int] = [0] * n_classes  # no member has more free GPUs than this
        self._running_ends: dict[int, list[tuple[float, int]]] = {}
        self._placed_ends: dict[int, list[tuple[float, int]]] = {}
        buckets = self.buckets
        ceiling = self.ceiling
        for i in range(n):
            p = profiles[i]
            free = p.usable_mask
            used = 0.0
            for r in workers[i].running:
                for d in r.devices:
                    free &= ~(1 << d)
                used += r.cpus
            self.free[i] = free
            self.cpus[i] = p.host_cpus - used
            if free:
                count = free.bit_count()
                self.count[i] = count
                cls = class_of[i]
                if cls.state_reason is None and p.homogeneous:
                    # Appended in index order: every bucket is a sorted list, hence a valid heap.
                    row = buckets[cls.id]
                    if len(row) <= count:
                        row.extend([] for _ in range(count + 1 - len(row)))
                    row[count].append(i)
                    if count > ceiling[cls.id]:
                        ceiling[cls.id] = count

    # -- between passes (cluster.py) ---------------------------------------------------------

    def fork(self, picks: Memo[tuple[int, int], int]) -> Index:
        """A copy for one pass to place on; this one keeps describing the cluster before it.

        Copies what a pass changes (free capacity, the bucket heaps) and starts the rest empty
        (reservations, what the pass placed); the busy devices' end times are derived from the
        workers alone and shared.
        """
        other = Index.__new__(Index)
        n = len(self.free)
        other.picks = picks
        other.workers = self.workers
        other.profiles = self.profiles
        other.class_of = self.class_of
        other.free = self.free.copy()
        other.count = self.count.copy()
        other.cpus = self.cpus.copy()
        other.holds = [None] * n
        other.held_mask = [0] * n
        other.held_by_class = {}
        other.held_free = {}
        other.held_room = {}
        other.buckets = [[heap.copy() for heap in row] for row in self.buckets]
        other.ceiling = self.ceiling.copy()
        other._running_ends = self._running_ends
        other._placed_ends = {}
        return other

    def patch(self, i: int, view: WorkerView) -> None:
        """Worker ``i`` now runs ``view.running`` (its class unchanged): re-derive its capacity.

        Only on an index no pass has placed on (the cluster's own): its buckets hold no stale
        entries, so each is kept sorted (a valid heap) by removing and inserting in place.
        """
        self.workers[i] = view
        p = self.profiles[i]
        free = p.usable_mask
        used = 0.0
        for r in view.running:
            for d in r.devices:
                free &= ~(1 << d)
            used += r.cpus
        before = self.count[i]
        count = free.bit_count()
        self.free[i] = free
        self.count[i] = count
        self.cpus[i] = p.host_cpus - used
        self._running_ends.pop(i, None)
        cls = self.class_of[i]
        if count == before or cls.state_reason is not None or not p.homogeneous:
            return
        row = self.buckets[cls.id]
        if before:
            heap = row[before]
            del heap[bisect_left(heap, i)]
        if count:
            if len(row) <= count:
                row.extend([] for _ in range(count + 1 - len(row)))
            insort(row[count], i)
        top = len(row) - 1
        while top > 0 and not row[top]:
            top -= 1
        self.ceiling[cls.id] = top

    # -- capacity changes --------------------------------------------------------------------

    def take(self, i: int, devices: int, cpus: float | None, until: float) -> None:
        """Mark ``devices`` and ``cpus`` on worker ``i`` used by a job placed in this pass."""
        if cpus:
            self.cpus[i] -= cpus
        if not devices:
            return
        self.free[i] &= ~devices
        count = self.free[i].bit_count()
        self.count[i] = count
        self._placed_ends.setdefault(i, []).append((until, devices))
        cls = self.class_of[i]
        if count and cls.profile.homogeneous and self.holds[i] is None:
            heapq.heappush(self.buckets[cls.id][count], i)

    def hold(self, i: int, owner: str, mask: int, starts_by: float | None) -> None:
        """Activate a reservation's devices on worker ``i`` (it leaves the buckets for good)."""
        holds = self.holds[i]
        cid = self.class_of[i].id
        if holds is None:
            holds = self.holds[i] = []
            self.held_by_class.setdefault(cid, []).append(i)
        holds.append(Hold(owner, mask, starts_by))
        self.held_mask[i] |= mask
        self.held_free[cid] = max(self.held_free.get(cid, 0), self.count[i])
        room = (self.free[i] & ~self.held_mask[i]).bit_count()
        self.held_room[cid] = max(self.held_room.get(cid, 0), room)

    def blocked(self, i: int, allowed: frozenset[str]) -> tuple[int, int, str | None]:
        """On worker ``i``: devices held by reservations the job may not use, devices held by
        ones it may use (it ends before they start), and the first such owner."""
        holds = self.holds[i]
        if holds is None:
            return 0, 0, None
        blocked = usable = 0
        via: str | None = None
        for h in holds:
            if h.owner in allowed:
                usable |= h.mask
                via = via or h.owner
            else:
                blocked |= h.mask
        return blocked, usable, via

    def free_at(self, i: int) -> list[tuple[float, int]]:
        """(time, device mask) for every busy device on ``i``, soonest first (inf: unknown)."""
        ends = self._running_ends.get(i)
        if ends is None:
            ends = []
            for r in self.workers[i].running:
                mask = 0
                for d in r.devices:
                    mask |= 1 << d
                if mask:
                    ends.append((INF if r.ends_by is None else r.ends_by, mask))
            self._running_ends[i] = ends
        placed = self._placed_ends.get(i)
        return sorted(ends + placed) if placed else sorted(ends)

    # -- search ------------------------------------------------------------------------------

    def pick(self, mask: int, n: int) -> int:
        """``pick_devices(mask, n)``, remembered."""
        key = (mask, n)
        hit = self.picks.new.get(key)
        if hit is None:
            hit = self.picks.get(key)
            if hit is None:
                hit = self.picks.put(key, pick_devices(mask, n))
        return hit

    def gpu_candidates(
        self,
        shape: Shape,
        lanes: Sequence[Lane],
        allowed: frozenset[str],
        limit: int,
        ok: frozenset[int] | None = None,
    ) -> list[NodeChoice]:
        """The best ``limit`` workers with room for ``shape.gpus`` devices now, best first (fewer
        when fewer have room). ``lanes``: the classes that pass for one kind choice (``lanes``),
        real before simulated; ``ok``: the workers whose labels match, if the job selects."""
        n = shape.gpus
        cpus = shape.cpus
        # Candidates as (key, free devices to pick from, reserved ones it may use, their owner);
        # the devices are picked, and a NodeChoice made, only for the chosen few.
        found: list[Found] = []
        best: Found | None = None  # limit == 1: the best so far, for pruning
        ceiling = self.ceiling
        held_by_class = self.held_by_class
        for cid, m, sim, bucketed, members in lanes:
            if best is not None and sim > best[0][0]:
                break  # lanes are real first: no simulated worker can beat a real one
            held = held_by_class.get(cid)
            if bucketed:
                top = ceiling[cid]
                if top < n and not held:
                    continue
                if best is not None and sim == best[0][0]:
                    top = min(top, n + best[0][1])
                seen = False
                row = self.buckets[cid]
                for k in range(n, top + 1):
                    heap = row[k]
                    if not heap:
                        continue
                    while heap and (self.count[heap[0]] != k or self.holds[heap[0]] is not None):
                        heapq.heappop(heap)  # stale: its count fell, or it now holds devices
                    if not heap:
                        continue
                    seen = True
                    if limit == 1:
                        i = self._first(heap, k, cpus, ok)
                        if i is not None:
                            key = (sim, k - n, i)
                            if best is None or key < best[0]:
                                best = (key, self.free[i], 0, None)
                            break
                    else:
                        for i in self._all(heap, k, cpus, ok):
                            found.append(((sim, k - n, i), self.free[i], 0, None))
                if not seen and n <= top == ceiling[cid]:
                    ceiling[cid] = n - 1  # nothing in [n, ceiling]: never again this pass
            else:
                for i in members:
                    if self.holds[i] is None and (ok is None or i in ok):
                        self._consider(i, m, n, cpus, sim, 0, 0, None, found)
            if held and (self.held_room[cid] if not allowed else self.held_free[cid]) >= n:
                self._holders(held, m, n, cpus, sim, allowed, ok, found, cid)
        if best is not None:
            found.append(best)
        found.sort(key=itemgetter(0))
        return [self._choice(n, *f) for f in found[:limit]]

    def _holders(
        self,
        held: list[int],
        m: int,
        n: int,
        cpus: float | None,
        sim: int,
        allowed: frozenset[str],
        ok: frozenset[int] | None,
        found: list[Found],
        cid: int,
    ) -> None:
        """Consider the members of class ``cid`` holding reservations (``held``)."""
        free_of = self.free
        held_mask = self.held_mask
        most_free = most_room = 0
        for i in held:
            free = free_of[i]
            most_free = max(most_free, free.bit_count())
            room = free & ~held_mask[i]
            most_room = max(most_room, room.bit_count())
            if ok is not None and i not in ok:
                continue
            if not allowed and (room & m).bit_count() < n:
                continue  # the common case, decided without building the hold masks
            blocked, usable, via = self.blocked(i, allowed)
            self._consider(i, m, n, cpus, sim, blocked, usable, via, found)
        # Every holder seen: the bounds are exact now (found ones are taken from later).
        self.held_free[cid] = most_free
        self.held_room[cid] = most_room

    def _choice(
        self, n: int, key: Key, avail: int, reserved_ok: int, via: str | None
    ) -> NodeChoice:
        # Prefer devices nobody reserved, so a backfill touches a reservation only when it must.
        plain = avail & ~reserved_ok
        devices = self.pick(plain, n) if plain.bit_count() >= n else self.pick(avail, n)
        return NodeChoice(key[2], devices, key[1], via if devices & reserved_ok else None)

    def _first(
        self, heap: list[int], k: int, cpus: float | None, ok: frozenset[int] | None
    ) -> int | None:
        top = heap[0]
        if (cpus is None or self.cpus[top] >= cpus) and (ok is None or top in ok):
            return top
        for i in self._all(heap, k, cpus, ok):
            return i
        return None

    def _all(
        self, heap: list[int], k: int, cpus: float | None, ok: frozenset[int] | None
    ) -> list[int]:
        return [
            i
            for i in sorted(set(heap))
            if self.count[i] == k
            and self.holds[i] is None
            and (cpus is None or self.cpus[i] >= cpus)
            and (ok is None or i in ok)
        ]

    def _consider(
        self,
        i: int,
        m: int,
        n: int,
        cpus: float | None,
        sim: int,
        blocked: int,
        reserved_ok: int,
        via: str | None,
        found: list[Found],
    ) -> None:
        avail = self.free[i] & m & ~blocked
        if avail.bit_count() < n or (cpus is not None and self.cpus[i] < cpus):
            return
        found.append(((sim, self.count[i] - n, i), avail, reserved_ok, via))

    def cpu_order(
        self, classes: Sequence[tuple[WorkerClass, Fit]], ok: frozenset[int] | None
    ) -> list[int]:
        """Workers for a CPU placement, best first (see the module docstring)."""
        order: list[tuple[int, int, int, int]] = []
        for cls, _fit in classes:
            p = cls.profile
            gpu = 1 if p.usable_count else 0
            real = 0 if p.sim_mask else 1
            for i in cls.members:
                if ok is None or i in ok:
                    order.append((gpu, real, p.usable_count, i))
        order.sort()
        return [key[3] for key in order]


def pick_devices(mask: int, n: int) -> int:
    """Choose ``n`` devices from ``mask``: the shortest contiguous run that fits, lowest first;
    without such a run, the ``n`` lowest indices (``Index.pick`` remembers the answers)."""
    runs: list[tuple[int, int]] = []  # (length, start)
    index = 0
    rest = mask
    while rest:
        if rest & 1:
            start = index
            while rest & 1:
                rest >>= 1
                index += 1
            runs.append((index - start, start))
        else:
            rest >>= 1
            index += 1
    fitting = [r for r in runs if r[0] >= n]
    if fitting:
        _length, start = min(fitting)
        chosen = ((1 << n) - 1) << start
    else:
        chosen = 0
        rest = mask
        for _ in range(n):
            low = rest & -rest
            chosen |= low
            rest ^= low
    return chosen


def bits(mask: int) -> list[int]:
    """Indices of the set bits, ascending."""
    out = []
    index = 0
    while mask:
        if mask & 1:
            out.append(index)
        mask >>= 1
        index += 1
    return out
