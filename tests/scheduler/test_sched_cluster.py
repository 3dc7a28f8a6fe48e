"""The standing cluster (cluster.py): kept between passes, patched, and never changing a plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer_kernel.contracts import Reason, WorkerState
from gpulayer_kernel.scheduler import SchedulerCache, WorkerView, schedule
from gpulayer_kernel.scheduler.testing import gpu_worker, job, running, snapshot

from .test_sched_properties import check_invariants, jobs, workers

# What can happen to one worker between two passes; only the first three keep its class.
EVENTS = ["start", "end", "busy", "labels", "cordon", "suspect", "rejoin"]


def _apply(w: WorkerView, event: str, k: int) -> WorkerView:
    devices = {d.index for d in w.capabilities.devices}
    busy = {d for r in w.running for d in r.devices}
    if event == "start":
        free = sorted(devices - busy)
        run = running(f"new-{k}", free[:1], cpus=1.0, ends_by=2000.0)
        return replace(w, running=(*w.running, run))
    if event == "end":
        return replace(w, running=w.running[1:])
    if event == "busy":
        flip = {WorkerState.READY: WorkerState.BUSY, WorkerState.BUSY: WorkerState.READY}
        return replace(w, state=flip.get(w.state, w.state))
    if event == "labels":
        return replace(w, labels={"zone": "b" if w.labels.get("zone") == "a" else "a"})
    if event == "cordon":
        return replace(w, state=WorkerState.CORDONED)
    if event == "suspect":
        return replace(w, hold=Reason.WORKER_SUSPECT)
    return replace(w, capabilities=w.capabilities.model_copy())  # "rejoin": equal, not the same


def _joined(parts: list[list[WorkerView]]) -> list[WorkerView]:
    """Several drawn clusters as one (ids made unique): classes with more members."""
    return [
        replace(w, id=f"{k}-{w.id}", name=f"{k}-{w.name}") for k, p in enumerate(parts) for w in p
    ]


@st.composite
def fleets(draw: st.DrawFn) -> list[WorkerView]:
    """Many workers of two kinds, partly busy: big classes, whose buckets a patch must keep."""
    out = []
    for i in range(draw(st.integers(3, 12))):
        kind = draw(st.sampled_from(["a100", "h100"]))
        busy = draw(st.sets(st.integers(0, 3)))
        runs = [
            running(f"r{i}-{d}", [d], ends_by=draw(st.sampled_from([None, 1500.0]))) for d in busy
        ]
        out.append(gpu_worker(f"w{i:02d}", 4, kind, running=runs))
    return out


@pytest.mark.slow  # ~6 s: 120 runs of up to nine passes, each against a fresh cache too
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers() | fleets() | st.lists(workers(), min_size=2, max_size=3).map(_joined),
    jobs(),
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(EVENTS), st.booleans()), max_size=8),
)
def test_a_patched_cluster_plans_as_a_fresh_one(
    ws: list[WorkerView], js: list, events: list[tuple[int, str, bool]]
) -> None:
    """Passes through one cache, the workers changing between them one at a time (and the queue
    now and then), give the plan a fresh cache gives, and keep the invariants."""
    cache = SchedulerCache()
    current = tuple(ws)
    queue = js
    for k, (who, event, new_queue) in enumerate(events):
        snap = snapshot(current, queue)
        plan = schedule(snap, cache)
        fresh = SchedulerCache()
        assert plan == schedule(snap, fresh)
        check_invariants(snap, plan)
        assert _state(cache) == _state(fresh)
        if current:
            i = who % len(current)
            current = (*current[:i], _apply(current[i], event, k), *current[i + 1 :])
        if new_queue:  # other CPU asks and names: the classes may split differently
            queue = queue[k % 3 :] + [job(f"late-{k}", seq=100 + k, cpus=float(1 + k % 5))]
    snap = snapshot(current, queue)
    assert schedule(snap, cache) == schedule(snap, SchedulerCache())


def _state(cache: SchedulerCache) -> object:
    """What the standing cluster holds, by value: a patched one must equal a fresh build."""
    c = cache.cluster
    if c is None:
        return None
    x = c.index
    return (
        [w.id for w in c.workers],
        [(w.running, w.state, dict(w.labels)) for w in c.workers],
        [cls.members for cls in c.classes],
        [cls.id for cls in c.class_of],
        (x.free, x.count, x.cpus, [_trimmed(row) for row in x.buckets], x.ceiling),
        [x.free_at(i) for i in range(len(c.workers))],
        c.labels(),
    )


def _trimmed(row: list[list[int]]) -> list[list[int]]:
    """A class's buckets without the empty ones past its fullest (a patch may leave those)."""
    end = len(row)
    while end and not row[end - 1]:
        end -= 1
    return row[:end]


def _fleet() -> tuple[WorkerView, ...]:
    return tuple(gpu_worker(f"w{i}", 4, "a100", running=[running(f"r{i}", [0])]) for i in range(6))


def test_a_job_ending_patches_the_cluster_and_a_cordon_rebuilds_it() -> None:
    cache = SchedulerCache()
    fleet = _fleet()
    queue = [job("a", 1, gpus=3)]
    first = schedule(snapshot(fleet, queue), cache)
    standing = cache.cluster
    assert standing is not None
    assert first.assignments[0].placement.nodes[0].worker_name == "w0"

    # The job on w3 ended (a new view of w3 only, and it flips to READY): patched in place.
    w3 = replace(fleet[3], running=(), state=WorkerState.READY)
    after = (*fleet[:3], w3, *fleet[4:])
    plan = schedule(snapshot(after, queue), cache)
    assert cache.cluster is standing
    assert standing.workers[3] is w3 and standing.index.count[3] == 4
    # Tightest fit: 3 GPUs on a worker with 3 free beats the one now wholly free.
    assert plan.assignments[0].placement.nodes[0].worker_name == "w0"
    two = [job("b", 2, gpus=4)]
    assert schedule(snapshot(after, two), cache).assignments[0].placement.nodes[0].devices == [
        0,
        1,
        2,
        3,
    ]
    assert cache.cluster is standing

    # A pass never places on the standing copy: it describes the cluster before any placement.
    assert standing.index.count == [3, 3, 3, 4, 3, 3]

    cordoned = (replace(fleet[0], state=WorkerState.CORDONED), *after[1:])
    plan = schedule(snapshot(cordoned, queue), cache)
    assert cache.cluster is not standing  # its class changed: built again
    assert plan.assignments[0].placement.nodes[0].worker_name == "w1"


def test_other_cpu_asks_keep_the_cluster_while_they_split_it_alike() -> None:
    cache = SchedulerCache()
    fleet = _fleet()  # every host has 32 CPUs
    schedule(snapshot(fleet, [job("a", 1, gpus=1, cpus=2.0)]), cache)
    standing = cache.cluster
    schedule(snapshot(fleet, [job("b", 2, gpus=1, cpus=4.0)]), cache)
    assert cache.cluster is standing  # 2 or 4 CPUs: every host holds either
    plan = schedule(snapshot(fleet, [job("c", 3, gpus=1, cpus=64.0)]), cache)
    assert plan.pending["c"].filtered[0].code == Reason.CPUS_TOTAL
