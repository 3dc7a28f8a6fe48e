"""Property tests: the invariants hold for any cluster and any queue."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer_kernel.contracts import WorkerState
from gpulayer_kernel.scheduler import (
    JobRequest,
    Plan,
    RunningJob,
    SchedulerCache,
    Snapshot,
    WorkerView,
    schedule,
)
from gpulayer_kernel.scheduler.explain import render
from gpulayer_kernel.scheduler.feasible import derive_profile, make_shape
from gpulayer_kernel.scheduler.testing import (
    GpuVendor,
    cpu_worker,
    gpu_worker,
    job,
    running,
    snapshot,
)

KINDS = ["h100", "a100", "l4"]
STATES = [WorkerState.READY] * 6 + [WorkerState.BUSY, WorkerState.CORDONED, WorkerState.DRAINING]


@st.composite
def workers(draw: st.DrawFn) -> list[WorkerView]:
    out: list[WorkerView] = []
    for i in range(draw(st.integers(0, 6) | st.integers(2, 6))):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        taken = [d for d in range(gpus) if draw(st.booleans())]
        runs = [
            running(
                f"run-{i}-{d}",
                [d],
                cpus=draw(st.sampled_from([0.0, 1.0, 4.0])),
                ends_by=draw(st.sampled_from([None, 1100.0, 5000.0])),
            )
            for d in taken
        ]
        kw = {
            "cpus": draw(st.sampled_from([4, 8, 32])),
            "state": draw(st.sampled_from(STATES)),
            "labels": {"zone": draw(st.sampled_from("ab"))},
            "running": runs,
        }
        if gpus == 0:
            out.append(cpu_worker(f"w{i}", **kw))  # type: ignore[arg-type]
        else:
            vendor: GpuVendor = draw(st.sampled_from(["nvidia", "nvidia", "sim", "apple"]))
            gpus = 1 if vendor == "apple" else gpus
            kw["running"] = [r for r in runs if all(d < gpus for d in r.devices)]
            out.append(
                gpu_worker(
                    f"w{i}",
                    gpus,
                    draw(st.sampled_from(KINDS)),
                    memory_gib=draw(st.sampled_from([24, 80])),
                    vendor=vendor,
                    **kw,  # type: ignore[arg-type]
                )
            )
    return out


@st.composite
def jobs(draw: st.DrawFn) -> list[JobRequest]:
    out = []
    for k in range(draw(st.integers(0, 14) | st.integers(6, 14))):
        gpus = draw(st.sampled_from([0, 0, 1, 1, 2, 4, 8]))
        kinds = draw(st.sampled_from([None, "h100", ["a100", "l4"], "sim", "a100-80gb"]))
        out.append(
            job(
                f"job-{k:02d}",
                seq=k,
                gpus=gpus,
                nodes=draw(st.sampled_from([1, 1, 2])) if gpus else 1,
                kind=kinds if gpus else None,
                memory_gib=draw(st.sampled_from([None, None, 40])) if gpus else None,
                cpus=draw(st.sampled_from([None, 1.0, 4.0])),
                fallback=draw(st.booleans()) if gpus else False,
                selector=draw(st.sampled_from([None] * 4 + [{"zone": "a"}])),
                worker=draw(st.sampled_from([None] * 6 + ["w1"])),
                priority=draw(st.sampled_from([0, 0, 1])),
                submitted_at=draw(st.sampled_from([0.0, 990.0])),
                timeout=draw(st.sampled_from([None, 50.0, 3000.0])),
            )
        )
    return out


def usable(w: WorkerView) -> set[int]:
    mask = derive_profile(w.capabilities).usable_mask
    return {d for d in range(64) if mask >> d & 1}


def check_invariants(snap: Snapshot, plan: Plan) -> None:
    by_id = {w.id: w for w in snap.workers}
    jobs_by_id = {j.id: j for j in snap.pending}
    # Every job is either placed or explained, never both.
    placed_ids = [a.job_id for a in plan.assignments]
    assert len(placed_ids) == len(set(placed_ids))
    assert set(placed_ids) | set(plan.pending) == set(jobs_by_id)
    assert not set(placed_ids) & set(plan.pending)
    # No device is ever double-booked, running jobs included.
    used: dict[str, set[int]] = {
        w.id: {d for r in w.running for d in r.devices} for w in snap.workers
    }
    cpus_used: dict[str, float] = {w.id: sum(r.cpus for r in w.running) for w in snap.workers}
    for a in plan.assignments:
        jr = jobs_by_id[a.job_id]
        r = jr.resources
        shape = make_shape(r)
        nodes = a.placement.nodes
        # A gang is all or nothing: every node, every device.
        assert len(nodes) == r.nodes
        assert [n.node_rank for n in nodes] == list(range(r.nodes))
        assert len({n.worker_id for n in nodes}) == r.nodes
        assert a.placement.explanation.startswith("placed on ")
        for n in nodes:
            w = by_id[n.worker_id]
            assert w.state in (WorkerState.READY, WorkerState.BUSY)
            assert n.worker_name == w.name
            if r.selector:
                assert all(w.labels.get(k) == v for k, v in r.selector.items())
            if r.worker:
                assert w.name == r.worker
            if n.cpu_fallback:
                # Fallback only when asked, only on a worker without usable GPUs.
                assert r.gpus > 0 and r.fallback == ["cpu"]
                assert n.devices == [] and not usable(w)
            elif r.gpus == 0:
                assert n.devices == []
            else:
                assert len(n.devices) == r.gpus
                assert set(n.devices) <= usable(w)
                assert not set(n.devices) & used[w.id], "double-booked"
                used[w.id] |= set(n.devices)
                kinds = {d.kind for d in w.capabilities.devices if d.index in n.devices}
                allowed = {c.kind for c in shape.choices}
                sim = all(d.vendor == "sim" for d in w.capabilities.devices)
                assert None in allowed or kinds <= allowed or ("sim" in allowed and sim)
                assert n.simulated == sim
            if r.cpus is not None:
                cpus_used[w.id] += r.cpus
                assert cpus_used[w.id] <= w.capabilities.host.cpus
    # Reservations never share a device, nor sit on a device a new placement took unless that
    # placement is a backfill that ends before the reservation starts.
    held: dict[tuple[str, int], str] = {}
    for res in plan.reservations.values():
        assert res.job_id in plan.pending
        for wid, devices in res.devices.items():
            for d in devices:
                assert (wid, d) not in held
                held[(wid, d)] = res.job_id
    # Every waiting job has a report whose sentence the one renderer produces.
    for position, (job_id, report) in enumerate(
        sorted(plan.pending.items(), key=lambda kv: kv[1].position or 0), 1
    ):
        assert report.job_id == job_id
        assert report.position == position
        assert report.sentence and report.sentence == render(report)
        assert report.workers_total == len(snap.workers)
        counted = sum(rc.workers for rc in [*report.filtered, *report.exhausted])
        if snap.workers:
            assert counted == len(snap.workers), report
        jr = jobs_by_id[job_id]
        if jr.resources.nodes == 1:
            assert report.workers_feasible == 0, report
        assert all(not rc.waiting_helps for rc in report.filtered)
        assert all(rc.waiting_helps for rc in report.exhausted)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
@SETTINGS
@given(workers(), jobs())
def test_invariants(ws: list[WorkerView], js: list[JobRequest]) -> None:
    snap = snapshot(ws, js, now=1000.0)
    check_invariants(snap, schedule(snap))


@pytest.mark.slow  # ~8 s with two xdist workers on two cores
@SETTINGS
@given(workers(), jobs(), st.randoms(use_true_random=False))
def test_same_snapshot_same_plan_whatever_the_input_order(
    ws: list[WorkerView], js: list[JobRequest], rnd: random.Random
) -> None:
    snap = snapshot(ws, js, now=1000.0)
    shuffled_w, shuffled_j = list(ws), list(js)
    rnd.shuffle(shuffled_w)
    rnd.shuffle(shuffled_j)
    again = replace(snap, workers=tuple(shuffled_w), pending=tuple(shuffled_j))
    assert schedule(snap) == schedule(again)
    assert schedule(snap) == schedule(snap)


@pytest.mark.slow  # ~9 s with two xdist workers on two cores
@SETTINGS
@given(workers(), jobs(), workers(), jobs())
def test_same_snapshot_same_plan_with_or_without_a_warm_cache(
    ws: list[WorkerView],
    js: list[JobRequest],
    other_ws: list[WorkerView],
    other_js: list[JobRequest],
) -> None:
    snap = snapshot(ws, js, now=1000.0)
    cold = schedule(snap)
    cache = SchedulerCache()
    schedule(snapshot(other_ws, other_js, now=1000.0), cache)  # warmed by another cluster
    assert schedule(snap, cache) == cold
    assert schedule(snap, cache) == cold  # every lookup a hit now
    # Objects equal to cached ones but not the same (a worker that joined again, a job sent
    # again), mixed with the cached ones: one class and one shape per value all the same.
    copies = snapshot(
        [
            replace(w, capabilities=w.capabilities.model_copy()) if i % 2 else w
            for i, w in enumerate(ws)
        ],
        [replace(j, resources=j.resources.model_copy()) if i % 2 else j for i, j in enumerate(js)],
        now=1000.0,
    )
    assert schedule(copies, cache) == cold


@pytest.mark.slow  # ~4 s with two xdist workers on two cores
@SETTINGS
@given(workers(), jobs())
def test_second_pass_with_reservations_keeps_the_invariants(
    ws: list[WorkerView], js: list[JobRequest]
) -> None:
    """Apply a plan (placed jobs start running) and schedule again with its reservations."""
    first = schedule(snapshot(ws, js, now=1000.0))
    runs: dict[str, list[RunningJob]] = {w.id: list(w.running) for w in ws}
    timeouts = {j.id: j.timeout for j in js}
    for a in first.assignments:
        t = timeouts[a.job_id]
        for n in a.placement.nodes:
            runs[n.worker_id].append(
                RunningJob(a.job_id, tuple(n.devices), 0.0, None if t is None else 1000.0 + t)
            )
    ws2 = [replace(w, running=tuple(runs[w.id])) for w in ws]
    waiting = [j for j in js if j.id in first.pending]
    snap = snapshot(ws2, waiting, now=1010.0, reservations=first.reservations)
    plan = schedule(snap)
    check_invariants(snap, plan)
    for job_id, res in plan.reservations.items():
        old = first.reservations.get(job_id)
        if old is not None:
            assert res.since == old.since


def run_until_placed(
    gang_first: bool, reserve_after: float, steps: int = 60
) -> tuple[int | None, int]:
    """Simulate a 4-GPU worker, one 4-GPU gang and a stream of 1-GPU jobs (one new every
    10 s, each running 25 s). Returns the step the gang started at (None: never) and how many
    small jobs ran."""
    now = 0.0
    active: list[RunningJob] = []
    queue: list[JobRequest] = [job("gang", 0, gpus=4, submitted_at=0.0)]
    reservations: dict = {}  # type: ignore[type-arg]
    started = 0
    for step in range(steps):
        active = [r for r in active if r.ends_by is None or r.ends_by > now]
        queue.append(job(f"small-{step}", step + 1, gpus=1, submitted_at=now, timeout=25.0))
        if step == 0 and not gang_first:
            # The cluster starts full of small jobs.
            active = [RunningJob(f"boot-{d}", (d,), 0.0, 5.0 * (d + 1)) for d in range(4)]
        w = gpu_worker("w1", 4, "a100", running=active)
        plan = schedule(
            Snapshot(
                now=now,
                pending=tuple(queue),
                workers=(w,),
                reservations=reservations,
                reserve_after=reserve_after,
            )
        )
        reservations = dict(plan.reservations)
        placed = {a.job_id: a for a in plan.assignments}
        if "gang" in placed:
            return step, started
        for a in plan.assignments:
            started += 1
            t = next(j.timeout for j in queue if j.id == a.job_id) or 0.0
            active.append(RunningJob(a.job_id, tuple(a.placement.nodes[0].devices), 0.0, now + t))
        queue = [j for j in queue if j.id not in placed]
        now += 10.0
    return None, started


def test_a_reserved_gang_is_not_starved_by_a_stream_of_small_jobs() -> None:
    step, _ = run_until_placed(gang_first=False, reserve_after=30.0)
    assert step is not None and step <= 10
    # Without reservations the same stream starves it: the test would notice if they stopped
    # working.
    never, ran = run_until_placed(gang_first=False, reserve_after=1e9)
    assert never is None and ran > 50


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.lists(st.sampled_from([10.0, 25.0, 40.0]), min_size=1, max_size=6))
def test_gang_waits_bounded_for_any_stream(size: int, durations: Sequence[float]) -> None:
    """However long the small jobs run, a gang that reserves starts once the jobs that held its
    devices when it reserved have ended: device d frees at 10 * (d + 1) s, so a gang of ``size``
    starts by 10 * size s, whatever backfills in between."""
    now = 0.0
    active = [RunningJob(f"boot-{d}", (d,), 0.0, 10.0 * (d + 1)) for d in range(4)]
    queue = [job("gang", 0, gpus=size, submitted_at=0.0)]
    reservations: dict = {}  # type: ignore[type-arg]
    for step in range(40):
        active = [r for r in active if r.ends_by is None or r.ends_by > now]
        d = durations[step % len(durations)]
        queue.append(job(f"s{step}", step + 1, gpus=1, submitted_at=now, timeout=d))
        w = gpu_worker("w1", 4, "a100", running=active)
        plan = schedule(Snapshot(now, tuple(queue), (w,), reservations, reserve_after=0.0))
        reservations = dict(plan.reservations)
        placed = {a.job_id for a in plan.assignments}
        if "gang" in placed:
            assert now <= 10.0 * size
            return
        for a in plan.assignments:
            t = next(j.timeout for j in queue if j.id == a.job_id) or 0.0
            active.append(RunningJob(a.job_id, tuple(a.placement.nodes[0].devices), 0.0, now + t))
        queue = [j for j in queue if j.id not in placed]
        now += 10.0
    raise AssertionError("the gang never started")
