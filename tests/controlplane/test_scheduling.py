"""The scheduling loop inside a ControlPlane on a FakeClock: snapshots, applying plans, timers."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    JobSpec,
    JobState,
    Resources,
    WorkerCapabilities,
    WorkerRegistration,
    WorkerState,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.scheduler import Plan, Snapshot
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import sim_caps


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


async def join(cp: ControlPlane, name: str = "w1", gpus: int = 0) -> str:
    caps = sim_caps(gpus) if gpus else WorkerCapabilities()
    return (await cp.register(WorkerRegistration(name=name, capabilities=caps))).id


# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


async def test_the_snapshot_holds_live_workers_and_what_they_run(gl_cp: ControlPlane) -> None:
    a = await join(gl_cp, "a", gpus=2)
    b = await join(gl_cp, "b", gpus=2)
    await gl_cp.deregister(b)
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))
    # Placed in memory first, then written and handed to the worker, whose usage follows.
    await until(lambda: gl_cp.registry.require(a).running, what="the worker to be busy")
    queued = await gl_cp.submit(cmd("true", resources=Resources(gpus=8)))
    snap = gl_cp.snapshot()
    assert [w.id for w in snap.workers] == [a]
    assert [(r.id, len(r.devices)) for r in snap.workers[0].running] == [(job.id, 1)]
    assert [p.id for p in snap.pending] == [queued.id]
    [w] = [w for w in await gl_cp.workers() if w.id == a]
    assert (w.state, w.running) == (WorkerState.BUSY, [job.id])


async def test_a_placement_missing_a_secret_fails_without_being_announced_as_placed(
    gl_cp: ControlPlane,
) -> None:
    wid = await join(gl_cp)
    job = await gl_cp.submit(cmd("true", secrets=["NOPE"]))
    await until(lambda: gl_cp.jobs.cached(job.id).state.terminal)  # type: ignore[union-attr]
    done = await gl_cp.get(job.id)
    assert done.state == JobState.FAILED and "NOPE" in (done.reason or "")
    page = await gl_cp.events()
    states = [e.job.state for e in page.events if e.job and e.job.id == job.id]
    assert states == [JobState.QUEUED, JobState.FAILED]
    assert (await gl_cp.next_work(wid)).assignments == []


async def test_a_queue_position_change_alone_is_not_announced(gl_cp: ControlPlane) -> None:
    wid = await join(gl_cp, gpus=1)
    await gl_cp.submit(cmd("sleep", "9", resources=Resources(gpus=1)))
    await until(lambda: gl_cp.registry.require(wid).running, what="the first job to be handed out")
    waiting = [await gl_cp.submit(cmd("true", resources=Resources(gpus=1))) for _ in range(3)]
    await until(lambda: all(gl_cp.jobs.active_job(j.id).pending for j in waiting))  # type: ignore[union-attr]
    before = (await gl_cp.events()).next_since
    await gl_cp.cancel(waiting[0].id)  # the others move up one place
    await until(lambda: gl_cp.jobs.active_job(waiting[2].id).pending.position == 2)  # type: ignore[union-attr]
    page = await gl_cp.events(since=before)
    assert {e.job.id for e in page.events if e.job} == {waiting[0].id}


async def test_explain_asks_the_scheduler_before_the_first_pass(gl_cp: ControlPlane) -> None:
    gl_cp.scheduling.close()  # no passes: as in a fresh CLI process
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))
    assert (await gl_cp.get(job.id)).pending is None
    said = await gl_cp.explain(job.id)
    assert said.startswith(f"0/0 workers can run job {job.id[:8]}: no workers have joined yet")


async def test_the_reservation_timer_is_armed_on_the_clock_and_disarmed_at_close(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.reserve_after = 60
    await join(gl_cp, gpus=1)
    # A gang that cannot fit, asked to wait for capacity.
    await gl_cp.submit(cmd("true", resources=Resources(gpus=2), wait_for_capacity=True))
    await until(lambda: gl_clock.next_deadline() is not None)
    timers = gl_clock.pending
    gl_cp.scheduling.close()
    assert gl_clock.pending == timers - 1


async def test_a_pass_may_pause_the_collector_and_always_restores_it(gl_cp: ControlPlane) -> None:
    gl_cp.scheduling.pause_gc = True
    assert gc.isenabled()
    job = await gl_cp.submit(cmd("true"))
    await join(gl_cp)
    await until(lambda: gl_cp.jobs.active_job(job.id).state == JobState.PLACED)  # type: ignore[union-attr]
    await asyncio.wait_for(gl_cp.scheduling.run_pass(), 5)
    assert gc.isenabled()


def on_a_thread(cp: ControlPlane, before: Callable[[Snapshot], None] = lambda _: None) -> list[int]:
    """Every pass of ``cp`` with a job waiting schedules on a thread; returns the threads'
    idents, one a pass (``before`` runs on the thread first)."""
    loop = cp.scheduling
    loop.thread_above = 1
    threads: list[int] = []
    plain = loop._schedule_now

    def spy(snapshot: Snapshot) -> Plan:
        if snapshot.pending:
            threads.append(threading.get_ident())
        before(snapshot)
        return plain(snapshot)

    loop._schedule_now = spy  # type: ignore[method-assign]
    return threads


async def test_a_big_queue_is_scheduled_on_a_thread_and_passes_never_overlap(
    gl_cp: ControlPlane,
) -> None:
    threads = on_a_thread(gl_cp)
    loop = gl_cp.scheduling
    inner = loop._run_pass
    now = peak = 0

    async def counted() -> None:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        try:
            await inner()
        finally:
            now -= 1

    loop._run_pass = counted  # type: ignore[method-assign]
    wid = await join(gl_cp, gpus=1)
    await gl_cp.submit(cmd("sleep", "9", resources=Resources(gpus=1)))
    await until(lambda: gl_cp.registry.require(wid).running, what="the first job to be handed out")
    waiting = [await gl_cp.submit(cmd("true", resources=Resources(gpus=1))) for _ in range(3)]
    await asyncio.gather(*(loop.run_pass() for _ in range(3)))  # direct callers wait their turn
    await until(lambda: all(gl_cp.jobs.active_job(j.id).pending for j in waiting))  # type: ignore[union-attr]
    assert [gl_cp.jobs.active_job(j.id).pending.position for j in waiting] == [1, 2, 3]  # type: ignore[union-attr]
    assert threads and threading.get_ident() not in threads
    assert peak == 1


async def test_a_threaded_pass_places_nothing_on_a_worker_gone_since_its_snapshot(
    gl_cp: ControlPlane,
) -> None:
    entered, go = threading.Event(), threading.Event()

    def held(snapshot: Snapshot) -> None:
        if snapshot.pending:
            entered.set()
            go.wait(10)

    on_a_thread(gl_cp, held)
    wid = await join(gl_cp, gpus=1)
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))
    await until(entered.is_set, what="a pass with the job to be on its thread")
    await gl_cp.deregister(wid)
    go.set()
    await until(lambda: gl_cp.jobs.active_job(job.id).pending is not None, what="the job's report")  # type: ignore[union-attr]
    after = gl_cp.jobs.active_job(job.id)
    assert after is not None and after.state == JobState.QUEUED and after.placement is None
