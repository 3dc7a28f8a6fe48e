"""Stage 3, the plan: ``schedule(snapshot) -> Plan``, the pure, deterministic scheduler (ADR 0004).

One pass walks the queue in order (priority high to low, then fair share between users: see
share.py; with one user, submission ``seq``, then id) and for
each job tries, in the job's kind-preference order, to place the whole gang at once on the best
workers (rank.py); else its CPU fallback when it asked for one; else the job waits. Capacity only
shrinks during a pass, so once a shape fails, nothing later of that shape can fit while the same
reservations are in its way: such jobs cost one set lookup, and their reports are built once per
shape and shared. A gang that has waited ``reserve_after`` seconds reserves the devices it will get
soonest; jobs behind it may use them only if their ``timeout`` ends before the reservation starts
(backfill). Reports for every waiting job come last (explain.py renders them).

No I/O, no clock (``now`` is in the snapshot), no randomness; every tie breaks on a stable key.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..contracts import NodePlacement, Placement, PlacementReport
from .cache import SchedulerCache
from .explain import finish, noted
from .feasible import Fit, Shape, WorkerClass, check, selected
from .model import Assignment, JobRequest, Plan, Reservation, Snapshot, WorkerView
from .placed import placed_node, placed_where, placed_why
from .rank import INF, NodeChoice, bits, lanes
from .shapes import ShapeInfo
from .share import QuotaLedger, fair_notes, fair_order


def schedule(snapshot: Snapshot, cache: SchedulerCache | None = None) -> Plan:
    """Place what fits now, explain what waits, and say which devices are reserved for whom.

    ``cache``: what earlier passes derived (hand the same one to every pass; none: a fresh one).
    The plan is the same with or without it.
    """
    with (SchedulerCache() if cache is None else cache).open_pass() as memo:
        return _Pass(snapshot, memo).run()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block: for the ControlPlane's own scheduling pass.

    A pass allocates tens of thousands of small acyclic objects, and the collector scans every
    live object several times over for nothing (measured with ``benchmarks/bench_scheduler.py``:
    a 10,000-job pass takes about a quarter longer with it running). The collector is
    process-wide, so ``schedule`` never pauses it itself: only a process that is the control
    plane's own (``gpulayer serve``, the Jupyter server extension) should, never a kernel whose
    user code runs on other threads meanwhile. Restores the collector's state whatever happens.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Pass:
    def __init__(self, snapshot: Snapshot, cache: SchedulerCache) -> None:
        self.cache = cache
        self.snap = snapshot
        self.now = snapshot.now
        # Queue order: priority high to low, then fair share between users, then seq, then id.
        self.queue: list[JobRequest] = fair_order(snapshot)
        self.quota = QuotaLedger(snapshot)
        self.held_back: dict[str, str] = {}  # job id -> why its user's quota holds it back
        cache = self.cache
        self.job_shapes: list[Shape] = cache.shapes([job.resources for job in self.queue])
        shapes = dict.fromkeys(self.job_shapes)  # one Shape object per shape number
        cpu_asks = sorted({s.cpus for s in shapes if s.cpus is not None})
        names = frozenset(s.worker for s in shapes if s.worker is not None)
        self.has_selectors = any(s.selector for s in shapes)
        # Workers sorted, classed and their free capacity: kept by the cache between passes and
        # patched where a worker's running jobs changed (cluster.py); this pass places on a copy.
        cluster = self.cluster = cache.cluster_for(snapshot.workers, cpu_asks, names)
        self.workers: list[WorkerView] = cluster.workers
        self.classes = cluster.classes
        self.index = cluster.index.fork(cache.picks)
        self.labels = cluster.labels() if self.has_selectors else {}
        self.infos: dict[int, ShapeInfo] = {}
        self.cursors: dict[int, int] = {}  # shape uid -> place_cpu's start (CPUs only fall)
        # Why a placement went where it went, by everything placed_why reads: jobs of one shape
        # placed alike share the words, and only where they went is written per job.
        self.whys: dict[tuple[object, ...], str] = {}
        self.cpu_sentences: dict[tuple[object, ...], str] = {}  # place_cpu's, by its workers
        self.verdicts: dict[
            tuple[int, float | None, str | None],
            tuple[list[Fit], list[tuple[WorkerClass, Fit]], list[tuple[WorkerClass, Fit]]],
        ] = {}
        self.active: list[tuple[str, float | None]] = []  # (owner, starts_by), activation order
        self.reservations: dict[str, Reservation] = {}
        self._allowed: dict[tuple[float, int], frozenset[str]] = {}

    # -- per shape ---------------------------------------------------------------------------

    def info(self, shape: Shape) -> ShapeInfo:
        info = self.infos.get(shape.uid)
        if info is None:
            # Derived from the standing cluster and its labels alone: an earlier pass's serves
            # while the cache hands this pass the same cluster (shapes.py).
            labels = self.labels if shape.selector else None
            infos = self.cache.infos
            hit = infos.get(shape.uid)
            if hit is not None and hit[0] is self.cluster and hit[1] is labels:
                info = hit[2]
            else:
                info = self._derive(shape)
                infos.put(shape.uid, (self.cluster, labels, info))
            self.infos[shape.uid] = info
        return info

    def _derive(self, shape: Shape) -> ShapeInfo:
        # The class checks read neither the selector nor anything outside (GPU request, CPUs,
        # worker name): shapes that differ only there share one verdict list.
        key = (shape.gpu_uid, shape.cpus, shape.worker)
        verdicts = self.verdicts.get(key)
        if verdicts is None:
            gpu_fit = self.cache.gpu_fit
            fits = [check(shape, cls, gpu_fit) for cls in self.classes]
            gpu = [(c, f) for c, f in zip(self.classes, fits, strict=True) if f.masks]
            cpu = [(c, f) for c, f in zip(self.classes, fits, strict=True) if f.cpu_only]
            verdicts = self.verdicts[key] = (fits, gpu, cpu)
        ok = selected(shape.selector, self.labels) if shape.selector else None
        return ShapeInfo(shape, *verdicts, ok)

    def allowed(self, job: JobRequest) -> frozenset[str]:
        """Active reservations whose devices ``job`` may use: it ends before they start."""
        if job.timeout is None or not self.active:
            return frozenset()
        ends = self.now + job.timeout
        key = (ends, len(self.active))
        hit = self._allowed.get(key)
        if hit is None:
            hit = frozenset(o for o, s in self.active if s is not None and ends <= s)
            self._allowed[key] = hit
        return hit

    # -- the pass ----------------------------------------------------------------------------

    def run(self) -> Plan:
        assignments: list[Assignment] = []
        waiting: list[tuple[JobRequest, Shape]] = []
        failed: set[tuple[int, frozenset[str]]] = set()
        unreservable: set[int] = set()  # shapes that found nothing to reserve (holds only grow)
        snap = self.snap
        empty: frozenset[str] = frozenset()
        active = self.active
        quotas = self.quota.quotas
        allowed_now = self.allowed
        # (timeout, reservations active) -> allowed_now's answer: the same for every job with
        # that timeout until another reservation starts (one lookup instead of a call per job).
        usable: dict[tuple[float, int], frozenset[str]] = {}
        for job, shape in zip(self.queue, self.job_shapes, strict=True):
            timeout = job.timeout
            if timeout is None or not active:
                allowed = empty
            else:
                at = (timeout, len(active))
                hit = usable.get(at)
                allowed = usable[at] = allowed_now(job) if hit is None else hit
            key = (shape.uid, allowed)
            over = self.quota.blocked(job) if quotas else None
            if over is not None:
                self.held_back[job.id] = over  # its shape may still fit another user's job
            elif key not in failed:
                placement = self.place(job, shape, self.info(shape), allowed)
                if placement is not None:
                    assignments.append(Assignment(job.id, placement))
                    if quotas:
                        self.quota.take(job)
                    continue
                failed.add(key)
            if (
                shape.gang
                and len(active) < snap.max_reservations
                and self.now - job.submitted_at >= snap.reserve_after
                and shape.uid not in unreservable
                and not self.reserve(job, shape, self.info(shape))
            ):
                unreservable.add(shape.uid)
            waiting.append((job, shape))
        pending = self.explain(waiting)
        return Plan(tuple(assignments), pending, dict(self.reservations))

    def place(
        self, job: JobRequest, shape: Shape, info: ShapeInfo, allowed: frozenset[str]
    ) -> Placement | None:
        if shape.cpu_job:
            return self.place_cpu(shape, info, fallback=False)
        if info.lanes is None:
            info.lanes = [lanes(info.gpu, c) for c in range(len(shape.choices))]
        for choice, choice_lanes in enumerate(info.lanes):
            nodes = self.index.gpu_candidates(shape, choice_lanes, allowed, shape.nodes, info.ok)
            if len(nodes) == shape.nodes:
                return self.commit(job, shape, nodes, choice)
        if shape.fallback:
            return self.place_cpu(shape, info, fallback=True)
        return None

    def commit(
        self, job: JobRequest, shape: Shape, nodes: Sequence[NodeChoice], choice: int
    ) -> Placement:
        until = INF if job.timeout is None else self.now + job.timeout
        prior = self.snap.reservations.get(job.id)
        own = prior is not None
        backfill: str | None = None
        out: list[NodePlacement] = []
        where: list[str] = []
        gang = len(nodes) > 1
        index = self.index
        for rank, node in enumerate(nodes):
            w = self.workers[node.worker]
            index.take(node.worker, node.devices, shape.cpus, until)
            devices = bits(node.devices)
            sim = bool(node.devices & index.profiles[node.worker].sim_mask)
            if prior is not None and not set(devices) <= set(prior.devices.get(w.id, ())):
                own = False
            backfill = backfill or node.via
            out.append(_node(w.id, w.name, devices, sim, rank))
            where.append(placed_node(w.name, devices, sim, rank if gang else None))
        key = (shape.uid, tuple(n.left_free for n in nodes), choice, own, backfill)
        why = self.whys.get(key)
        if why is None:
            why = self.whys[key] = placed_why(
                shape, key[1], choice=choice, own_reservation=own, backfill_of=backfill
            )
        return _placement(out, placed_where(where, why))

    def place_cpu(self, shape: Shape, info: ShapeInfo, *, fallback: bool) -> Placement | None:
        """A placement without devices: a CPU job, or a GPU job's CPU fallback."""
        if info.cpu_order is None:
            info.cpu_order = self.index.cpu_order(info.cpu, info.ok)
        order = info.cpu_order
        cpus = self.index.cpus
        need = shape.cpus
        start = self.cursors.get(shape.uid, 0)
        if need is not None:
            while start < len(order) and cpus[order[start]] < need:
                start += 1
            self.cursors[shape.uid] = start
        if need is None:
            chosen = order[start : start + shape.nodes]
        else:
            chosen = []
            for k in range(start, len(order)):
                i = order[k]
                if cpus[i] >= need:
                    chosen.append(i)
                    if len(chosen) == shape.nodes:
                        break
        if len(chosen) < shape.nodes:
            return None
        index = self.index
        workers = self.workers
        # Without devices the words name only the workers and whether it is a fallback (a CPU
        # job's placement is never one): jobs placed on the same workers share the sentence.
        key = (fallback, *chosen)
        sentence = self.cpu_sentences.get(key)
        if sentence is None:
            gang = len(chosen) > 1
            where = [
                placed_node(workers[i].name, (), False, rank if gang else None)
                for rank, i in enumerate(chosen)
            ]
            gpu_worker = index.profiles[chosen[0]].usable_count > 0
            lefts = tuple(index.count[i] for i in chosen)
            why = placed_why(shape, lefts, fallback=fallback, gpu_worker=gpu_worker)
            sentence = self.cpu_sentences[key] = placed_where(where, why)
        out: list[NodePlacement] = []
        for rank, i in enumerate(chosen):
            w = workers[i]
            if need:
                index.cpus[i] -= need  # Index.take without devices, inlined: thousands a pass
            out.append(_cpu_node(w.id, w.name, rank, fallback))
        return _placement(out, sentence)

    # -- reservations ------------------------------------------------------------------------

    def reserve(self, job: JobRequest, shape: Shape, info: ShapeInfo) -> bool:
        """Hold the devices this waiting gang will get soonest, so smaller jobs cannot starve it.

        Candidates: every worker that passes the static checks for a kind choice (tried in the
        job's order) with enough devices not already reserved by a job ahead. Ranked by when
        enough of them are free (running jobs' ``ends_by``; unknown = never), then real before
        simulated, then worker id. Last pass's reservation is kept while it stays valid.
        """
        index = self.index
        prior = self.snap.reservations.get(job.id)
        for choice in range(len(shape.choices)):
            cands: list[tuple[float, int, int, int]] = []  # (free at, simulated, worker, devices)
            reservable: dict[int, int] = {}  # worker -> devices it could reserve
            for cls, fit in info.gpu:
                m = fit.masks[choice]
                if not m:
                    continue
                sim = 1 if cls.profile.sim_mask else 0
                for i in cls.members:
                    if info.ok is not None and i not in info.ok:
                        continue
                    held = 0
                    for h in index.holds[i] or ():
                        held |= h.mask
                    avail = m & ~held
                    if avail.bit_count() < shape.gpus:
                        continue
                    reservable[i] = avail
                    at, devices = self._soonest(i, avail, shape.gpus)
                    cands.append((at, sim, i, devices))
            picked = self._prior(prior, reservable) if prior is not None else None
            if picked is None:
                if len(cands) < shape.nodes:
                    continue
                cands.sort()
                picked = [(at, i, devices) for at, _sim, i, devices in cands[: shape.nodes]]
            latest = max(at for at, _i, _d in picked)
            starts_by = None if latest == INF else latest
            for _at, i, devices in picked:
                index.hold(i, job.id, devices, starts_by)
            self.active.append((job.id, starts_by))
            self.reservations[job.id] = Reservation(
                job_id=job.id,
                devices={self.workers[i].id: tuple(bits(d)) for _at, i, d in picked},
                since=prior.since if prior is not None else self.now,
                starts_by=starts_by,
            )
            return True
        return False

    def _soonest(self, i: int, avail: int, n: int) -> tuple[float, int]:
        """When ``n`` of the ``avail`` devices on ``i`` will be free at the latest, and which."""
        have = self.index.free[i] & avail
        if have.bit_count() >= n:
            return self.now, self.index.pick(have, n)
        for at, mask in self.index.free_at(i):
            have |= mask & avail
            if have.bit_count() >= n:
                return max(at, self.now), self.index.pick(have, n)
        return INF, self.index.pick(avail, n)

    def _prior(
        self, prior: Reservation, reservable: dict[int, int]
    ) -> list[tuple[float, int, int]] | None:
        """Last pass's reservation, if every device in it is still reservable: keeping it stops
        a reservation from wandering while its devices drain."""
        position = {self.workers[i].id: i for i in reservable}
        picked: list[tuple[float, int, int]] = []
        for worker_id, devices in sorted(prior.devices.items()):
            i = position.get(worker_id)
            mask = 0
            for d in devices:
                mask |= 1 << d
            if i is None or mask & ~reservable[i] or mask.bit_count() != len(devices):
                return None
            at, _ = self._soonest(i, mask, len(devices))
            picked.append((at, i, mask))
        return picked or None

    # -- explanations ------------------------------------------------------------------------

    def explain(self, waiting: Sequence[tuple[JobRequest, Shape]]) -> dict[str, PlacementReport]:
        if not waiting:
            return {}
        # Imported on the first pass that has waiting jobs: a cold start's first passes (a worker
        # joining, one job placed) never need it (issue 14, item 5: import time).
        from .reports import Reports

        reports = Reports(
            self.index,
            self.classes,
            self.workers,
            self.reservations,
            self.info,
            self.cache.counts,
            self.cache.templates,
        )
        Key = tuple[int, frozenset[str] | None, str | None]
        Hit = tuple[PlacementReport, tuple[str, str]]
        templates: dict[Key, Hit] = {}
        by_timeout: dict[tuple[int, float | None], Hit] = {}  # jobs holding no reservation
        usable: dict[tuple[int, float | None], frozenset[str] | None] = {}
        owners = self.reservations
        out: dict[str, PlacementReport] = {}
        for position, (job, shape) in enumerate(waiting, 1):
            # Against the final reservations: whether a job may use a reservation never changes,
            # and those made after its turn cannot give it room it lacked then (capacity only
            # fell since), so this groups more jobs under one report without changing any; and
            # only reservations held on workers that could run the shape can matter to it.
            # So a job holding none gets the report of its (shape, timeout): one lookup.
            uk = (shape.uid, job.timeout)
            owner = job.id in owners
            hit = None if owner else by_timeout.get(uk)
            if hit is None:
                if uk in usable:
                    allowed = usable[uk]
                else:
                    held = reports.held_owners(shape)
                    allowed = usable[uk] = self.allowed(job) & held if held else None
                key = (shape.uid, allowed, job.id if owner else None)
                hit = templates.get(key)
                if hit is None:
                    hit = templates[key] = reports.report(shape, allowed or frozenset(), key[2])
                if not owner:
                    by_timeout[uk] = hit
            out[job.id] = finish(hit[0], hit[1], job.id, position)
        fair = fair_notes(self.queue) if len({j.owner for j, _ in waiting}) > 1 else {}
        for job_id in self.held_back.keys() | fair.keys():
            if job_id in out:
                out[job_id] = noted(out[job_id], self.held_back.get(job_id), fair.get(job_id))
        return out


# ------------------------------------------------------------------------------------------------
# placements, made as pydantic's validation makes them from what the pass built (every part is
# ours and of the right type), at a fraction of its cost: a 10,000-job pass places thousands of
# jobs, two models each, ~8 us validated. The same ``__dict__`` and fields set as
# ``NodePlacement(...)`` / ``Placement(...)`` with these keywords; a test holds them equal.

_new_node = NodePlacement.__new__
_new_placement = Placement.__new__
_set = object.__setattr__
_API_VERSION = NodePlacement.model_fields["api_version"].default
_GPU_SET = frozenset({"worker_id", "worker_name", "devices", "simulated", "node_rank"})
_CPU_SET = frozenset({"worker_id", "worker_name", "node_rank", "cpu_fallback"})
_PLACEMENT_SET = frozenset({"nodes", "explanation"})


def _made(obj: object, fields: dict[str, object], fields_set: frozenset[str]) -> None:
    _set(obj, "__dict__", fields)
    _set(obj, "__pydantic_fields_set__", set(fields_set))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)


def _node(
    worker_id: str, worker_name: str, devices: list[int], simulated: bool, rank: int
) -> NodePlacement:
    """``NodePlacement(worker_id=, worker_name=, devices=, simulated=, node_rank=)``."""
    node = _new_node(NodePlacement)
    fields = {
        "api_version": _API_VERSION,
        "worker_id": worker_id,
        "worker_name": worker_name,
        "devices": devices,
        "simulated": simulated,
        "node_rank": rank,
        "cpu_fallback": False,
    }
    _made(node, fields, _GPU_SET)
    return node


def _cpu_node(worker_id: str, worker_name: str, rank: int, fallback: bool) -> NodePlacement:
    """``NodePlacement(worker_id=, worker_name=, node_rank=, cpu_fallback=)``."""
    node = _new_node(NodePlacement)
    fields = {
        "api_version": _API_VERSION,
        "worker_id": worker_id,
        "worker_name": worker_name,
        "devices": [],
        "simulated": False,
        "node_rank": rank,
        "cpu_fallback": fallback,
    }
    _made(node, fields, _CPU_SET)
    return node


def _placement(nodes: list[NodePlacement], explanation: str) -> Placement:
    """``Placement(nodes=, explanation=)`` (``nodes`` not empty)."""
    placement = _new_placement(Placement)
    _made(
        placement,
        {"api_version": _API_VERSION, "nodes": nodes, "explanation": explanation},
        _PLACEMENT_SET,
    )
    return placement
