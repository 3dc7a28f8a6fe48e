"""What passes share (shapes.py, reports.py's summaries, plan.py's placements) says exactly what
computing it afresh for each job and each worker says."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer_kernel.contracts import NodePlacement, Placement, Reason
from gpulayer_kernel.scheduler import JobRequest, SchedulerCache, Snapshot, WorkerView, schedule
from gpulayer_kernel.scheduler.feasible import Shape
from gpulayer_kernel.scheduler.plan import _cpu_node, _node, _Pass, _placement
from gpulayer_kernel.scheduler.reports import CANDIDATES, Reports
from gpulayer_kernel.scheduler.testing import gpu_worker, job, running, snapshot

from .test_sched_cluster import EVENTS, _apply
from .test_sched_properties import jobs, workers

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _per_worker(
    p: _Pass, job: JobRequest, allowed: frozenset[str]
) -> tuple[int, dict[Reason, int], str | None, list[str]]:
    """A waiting job's report worked out one worker at a time against the pass's final state,
    with nothing shared: (workers that can run it, workers per reason, reserved_by, candidates).
    """
    shape = p.job_shapes[p.queue.index(job)]
    info = p._derive(shape)  # not the cached one
    owner = job.id in p.reservations
    if owner:
        allowed = allowed | {job.id}
    counts: dict[Reason, int] = {}
    owners: list[str] = []
    ranked: list[tuple[int, int, int]] = []
    dynamic: dict[Reason, int] = {}
    room = 0
    for cls in p.classes:  # class order, then worker order: the order owners are named in
        fit = info.fits[cls.id]
        for i in cls.members:
            if info.ok is not None and cls.state_reason is None and i not in info.ok:
                static: Reason | None = Reason.SELECTOR_MISMATCH
            else:
                static = fit.reason
            if static is not None:
                counts[static] = counts.get(static, 0) + 1
                continue
            code, best = _verdict(p, i, fit.masks, fit.cpu_only, shape, allowed, owners)
            if code is None:
                room += 1
            else:
                dynamic[code] = dynamic.get(code, 0) + 1
            ranked.append((0 if code is None else 1, -best, i))
    qualifying = room + sum(dynamic.values())
    if shape.nodes > 1 and qualifying < shape.nodes:
        counts[Reason.TOO_FEW_NODES] = qualifying
        room = 0
    else:
        counts.update(dynamic)
        if shape.nodes > 1 and room:
            counts[Reason.NOT_ENOUGH_NODES] = room
    names = [p.workers[i].name for _, _, i in sorted(ranked)[:CANDIDATES]]
    return room, {c: n for c, n in counts.items() if n}, owners[0] if owners else None, names


def _verdict(
    p: _Pass,
    i: int,
    masks: tuple[int, ...],
    cpu_only: bool,
    shape: Shape,
    allowed: frozenset[str],
    owners: list[str],
) -> tuple[Reason | None, int]:
    index = p.index
    need = shape.cpus
    n = shape.gpus
    if cpu_only:
        return (None if need is None or index.cpus[i] >= need else Reason.CPUS_BUSY), 0
    blocked = 0
    for h in index.holds[i] or ():
        if h.owner not in allowed:
            blocked |= h.mask
    free = index.free[i]
    best = 0
    code: Reason | None = Reason.GPUS_BUSY
    for m in masks:
        if not m:
            continue
        have = (free & m & ~blocked).bit_count()
        best = max(best, have)
        if have >= n:
            return (None if need is None or index.cpus[i] >= need else Reason.CPUS_BUSY), best
        if (free & m).bit_count() >= n:
            code = Reason.RESERVED
            for h in index.holds[i] or ():
                if h.mask & blocked & free & m and h.owner not in owners:
                    owners.append(h.owner)
    return code, best


def _check_reports(snap: Snapshot, cache: SchedulerCache) -> None:
    with cache.open_pass() as memo:
        p = _Pass(snap, memo)
        plan = p.run()
        reports = Reports(p.index, p.classes, p.workers, p.reservations, p.info)
        for position, jr in enumerate([j for j in p.queue if j.id in plan.pending], 1):
            report = plan.pending[jr.id]
            assert report.position == position
            held = reports.held_owners(p.job_shapes[p.queue.index(jr)])
            allowed = p.allowed(jr) & held if held else frozenset()
            room, counts, reserved_by, candidates = _per_worker(p, jr, allowed)
            got = {rc.code: rc.workers for rc in [*report.filtered, *report.exhausted]}
            assert (report.workers_feasible, got) == (room, counts), report.sentence
            assert report.reserved_by == reserved_by
            assert report.candidates == candidates
            assert sum(got.values()) == len(snap.workers)


@pytest.mark.slow  # ~6 s with two xdist workers on two cores
@SETTINGS
@given(workers(), jobs())
def test_reports_count_as_one_worker_at_a_time_would(
    ws: list[WorkerView], js: list[JobRequest]
) -> None:
    # now=1000 and jobs submitted at 0: gangs reserve, so workers hold devices for them.
    _check_reports(snapshot(ws, js, now=1000.0), SchedulerCache())


@pytest.mark.slow  # ~4 s with two xdist workers on two cores
@SETTINGS
@given(
    workers(),
    jobs(),
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(EVENTS)), min_size=1, max_size=4),
)
def test_what_a_cluster_kept_from_earlier_passes_counts_the_same(
    ws: list[WorkerView], js: list[JobRequest], events: list[tuple[int, str]]
) -> None:
    """Passes through one cache while workers change (labels too): what it kept per shape and
    cluster is never stale, and every report still counts as one worker at a time would."""
    cache = SchedulerCache()
    current = tuple(ws)
    for k, (who, event) in enumerate(events):
        schedule(snapshot(current, js, now=1000.0), cache)
        if current:
            i = who % len(current)
            current = (*current[:i], _apply(current[i], event, k), *current[i + 1 :])
    snap = snapshot(current, js, now=1000.0)
    _check_reports(snap, cache)
    assert schedule(snap, cache) == schedule(snap, SchedulerCache())


def test_one_shape_two_timeouts_two_reports() -> None:
    """Jobs of one shape, one ending before a reservation starts and one not, share what the
    workers without reservations say but not what the reserving worker says."""
    w1 = gpu_worker("w1", 4, "a100", cpus=4, running=[running("r", [0], cpus=4.0, ends_by=1100.0)])
    queue = [
        job("gang", 1, gpus=4, priority=1, submitted_at=0.0),
        job("short", 2, gpus=1, cpus=1.0, submitted_at=990.0, timeout=50.0),
        job("long", 3, gpus=1, cpus=1.0, submitted_at=990.0, timeout=3000.0),
    ]
    snap = snapshot(
        [w1, gpu_worker("w2", 1, "a100", running=[running("q", [0])])], queue, now=1000.0
    )
    plan = schedule(snap)
    assert plan.reservations["gang"].starts_by == 1100.0
    # It may use the reserved GPUs but has no CPU; the other may not use them at all.
    assert [rc.code for rc in plan.pending["short"].exhausted] == [
        Reason.GPUS_BUSY,
        Reason.CPUS_BUSY,
    ]
    assert [rc.code for rc in plan.pending["long"].exhausted] == [Reason.GPUS_BUSY, Reason.RESERVED]
    _check_reports(snap, SchedulerCache())


def test_a_label_change_on_a_patched_cluster_is_seen() -> None:
    """The same workers but one's labels changed: the cluster is patched, not rebuilt, and what
    a pass kept about which workers a selector matches must not be used again."""
    workers = [gpu_worker(f"w{i}", 2, "a100", labels={"zone": "a"}) for i in range(3)]
    queue = [job("sel", 1, gpus=1, selector={"zone": "a"})]
    cache = SchedulerCache()
    assert schedule(snapshot(workers, queue), cache).assignments[0].placement.nodes[0].worker_id
    cluster = cache.cluster
    moved = [replace(w, labels={"zone": "b"}) for w in workers]
    plan = schedule(snapshot(moved, queue), cache)
    assert cache.cluster is cluster  # patched: the entry's cluster alone would not tell
    assert not plan.assignments
    assert plan.pending["sel"].filtered[0].code is Reason.SELECTOR_MISMATCH
    assert plan == schedule(snapshot(moved, queue), SchedulerCache())


def test_placements_are_what_validation_makes() -> None:
    fast = _placement([_node("w1", "gpu-1", [0, 1], True, 0), _cpu_node("w2", "c", 1, True)], "x")
    slow = Placement(
        nodes=[
            NodePlacement(
                worker_id="w1", worker_name="gpu-1", devices=[0, 1], simulated=True, node_rank=0
            ),
            NodePlacement(worker_id="w2", worker_name="c", node_rank=1, cpu_fallback=True),
        ],
        explanation="x",
    )
    assert fast == slow
    for a, b in [(fast, slow), *zip(fast.nodes, slow.nodes, strict=True)]:
        assert a.__dict__ == b.__dict__ and list(a.__dict__) == list(b.__dict__)
        assert a.__pydantic_fields_set__ == b.__pydantic_fields_set__
        assert a.model_dump(exclude_unset=True) == b.model_dump(exclude_unset=True)
    assert fast.model_dump_json() == slow.model_dump_json()
    # Each placement owns its parts: nothing shared that a reader could change for another.
    other = _cpu_node("w2", "c", 1, True)
    assert other.devices is not fast.nodes[1].devices
    assert other.__pydantic_fields_set__ is not fast.nodes[1].__pydantic_fields_set__
