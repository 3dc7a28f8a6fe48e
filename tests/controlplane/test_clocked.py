"""The whole ControlPlane on a FakeClock: heartbeat loss, reservations, retries, rendezvous
timeouts, long-poll timeouts and event cursors, with workers played by the test (no processes).

No test here waits real seconds for a timeout: time moves only when a test advances the clock.
``until`` waits only for the store's thread hops to land.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    FinishReport,
    JobAssignment,
    JobReport,
    JobSpec,
    JobState,
    LogLine,
    Rendezvous,
    Resources,
    WorkerCapabilities,
    WorkerRegistration,
    WorkerState,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import Conflict
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import sim_caps

HEARTBEAT = 2.0  # gl_cp's heartbeat timeout; the reaper looks every quarter of it


# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


async def join(cp: ControlPlane, name: str = "w1", gpus: int = 0) -> str:
    caps = sim_caps(gpus) if gpus else WorkerCapabilities()
    return (await cp.register(WorkerRegistration(name=name, capabilities=caps))).id


async def take(cp: ControlPlane, worker_id: str) -> JobAssignment:
    """The next assignment for ``worker_id``: its long-poll answers when the pass hands it out.

    The clock never moves here, so the long-poll cannot time out; ``wait_for`` only guards the
    test against a hang.
    """
    work = await asyncio.wait_for(cp.next_work(worker_id, wait=3600), 10)
    [a] = work.assignments
    return a


async def state_is(cp: ControlPlane, job_id: str, state: JobState) -> Callable[[], object]:
    async def check() -> bool:
        return (await cp.get(job_id)).state == state

    return check


async def advance_until(
    clock: FakeClock, check: Callable[[], object], step: float, most: float
) -> None:
    """Advance ``step`` at a time (at most ``most`` seconds of fake time) until ``check()``."""
    moved = 0.0
    while moved < most:
        await clock.advance(step)
        moved += step
        try:
            await until(check, timeout=0.05)
            return
        except TimeoutError:
            continue
    await until(check, timeout=5)


async def test_a_silent_worker_is_lost_after_the_heartbeat_timeout(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    wid = await join(gl_cp)
    job = await gl_cp.submit(cmd("sleep", "30"))
    await take(gl_cp, wid)
    await gl_cp.report_started(wid, job.id)
    await gl_clock.advance(HEARTBEAT - 0.1)
    await until(await state_is(gl_cp, job.id, JobState.RUNNING))
    assert (await gl_cp.workers())[0].live  # not yet: the timeout has not passed
    await advance_until(gl_clock, await state_is(gl_cp, job.id, JobState.LOST), 0.5, 5)
    done = await gl_cp.get(job.id)
    assert done.reason is not None and "no heartbeat" in done.reason

    # The worker's usage is recounted once the job's change is written (a thread hop later).
    async def recounted() -> bool:
        [w] = await gl_cp.workers()
        return not w.running

    await until(recounted, what="the lost worker's usage to be recounted")
    [w] = await gl_cp.workers()
    assert (w.state, w.live, w.running) == (WorkerState.LOST, False, [])


async def test_a_lost_worker_s_job_that_may_retry_is_queued_again(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    wid = await join(gl_cp)
    job = await gl_cp.submit(cmd("sleep", "30", retries=1, retry_backoff=0))
    await take(gl_cp, wid)
    await gl_cp.report_started(wid, job.id)
    await advance_until(gl_clock, await state_is(gl_cp, job.id, JobState.QUEUED), 0.5, 5)
    again = await gl_cp.get(job.id)
    assert (again.attempts, again.placement) == (1, None)
    system = [r.text for r in (await gl_cp.logs(job.id)).records if r.stream == "system"]
    assert any("attempt 1 failed (worker w1 was lost: no heartbeat" in t for t in system)


async def test_a_heartbeat_keeps_a_worker_alive(gl_cp: ControlPlane, gl_clock: FakeClock) -> None:
    wid = await join(gl_cp)
    for _ in range(10):
        await gl_clock.advance(HEARTBEAT / 2)
        await gl_cp.heartbeat(wid)
    assert [w.state for w in await gl_cp.workers()] == [WorkerState.READY]


async def test_a_worker_that_reports_is_alive_without_heartbeats(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    """Reports count as heartbeats: a worker shipping a job's lines (its heartbeats late behind
    them on a loaded machine) keeps its job; once it falls silent, it is lost as ever."""
    wid = await join(gl_cp)
    job = await gl_cp.submit(cmd("sleep", "30"))
    await take(gl_cp, wid)
    await gl_cp.report_started(wid, job.id)
    for i in range(10):
        await gl_clock.advance(HEARTBEAT / 2)
        line = LogLine(time=0, stream="stdout", text=str(i))
        assert await gl_cp.report(wid, [JobReport(job_id=job.id, attempt=0, lines=[line])]) == [
            None
        ]
    assert (await gl_cp.get(job.id)).state == JobState.RUNNING
    assert [w.live for w in await gl_cp.workers()] == [True]
    await advance_until(gl_clock, await state_is(gl_cp, job.id, JobState.LOST), 0.5, 5)


async def test_a_report_after_its_long_poll_closed_does_not_make_a_worker_schedulable(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    """A stopping worker closes its long-poll, then reports its jobs' ends: the report keeps it
    alive but must not clear the closed poll's mark, or a retry of its job is handed back to
    the worker that is leaving (seen in the suite's Slurm and SSH-fleet tests)."""
    wid = await join(gl_cp)
    job = await gl_cp.submit(cmd("sleep", "30"))
    await take(gl_cp, wid)
    await gl_cp.report_started(wid, job.id)
    gl_cp.worker_disconnected(wid)
    assert gl_cp.registry.trouble(wid) is not None
    before = (await gl_cp.workers())[0].last_heartbeat
    await gl_clock.advance(1.0)
    line = LogLine(time=0, stream="stdout", text="last words")
    assert await gl_cp.report(wid, [JobReport(job_id=job.id, attempt=0, lines=[line])]) == [None]
    [w] = await gl_cp.workers()
    assert w.last_heartbeat > before  # alive ...
    trouble = gl_cp.registry.trouble(wid)  # ... and still not taking work
    assert trouble is not None and "connection closed" in trouble


async def test_a_failing_job_with_retries_is_requeued_and_counts_attempts(
    gl_cp: ControlPlane,
) -> None:
    wid = await join(gl_cp)
    job = await gl_cp.submit(cmd("false", retries=2, retry_on=["failed"], retry_backoff=0))
    for attempt in range(3):
        a = await take(gl_cp, wid)
        assert a.job.attempts == attempt
        await gl_cp.report_started(wid, job.id)
        failed = FinishReport(state="failed", exit_code=1, reason="exited with code 1")
        after = await gl_cp.report_finished(wid, job.id, failed)
        assert after.attempts == min(attempt + 1, 2)
    done = await gl_cp.get(job.id)
    assert (done.state, done.attempts, done.reason) == (JobState.FAILED, 2, "exited with code 1")
    system = [r.text for r in (await gl_cp.logs(job.id)).records if r.stream == "system"]
    assert sum("retrying" in t for t in system) == 2
    # A second report of the same end changes nothing.
    assert (await gl_cp.report_finished(wid, job.id, failed)).state == JobState.FAILED


async def test_a_waiting_gang_gets_a_reservation_when_the_clock_says_so(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.reserve_after = 60
    wid = await join(gl_cp, gpus=2)
    small = await gl_cp.submit(cmd("sleep", "30", resources=Resources(gpus=1)))
    await take(gl_cp, wid)
    gang = await gl_cp.submit(cmd("true", resources=Resources(gpus=2)))

    async def reserved() -> bool:
        report = (await gl_cp.get(gang.id)).pending
        return report is not None and bool(report.reservation)

    async def pending() -> bool:
        return (await gl_cp.get(gang.id)).pending is not None

    await until(pending)
    assert not await reserved()
    # Heartbeats keep the worker; the only thing that happens at 60 s is the timer.
    for _ in range(59):
        await gl_clock.advance(1)
        await gl_cp.heartbeat(wid)
    assert not await reserved()
    await advance_until(gl_clock, reserved, 0.5, 5)
    await gl_cp.report_started(wid, small.id)
    await gl_cp.report_finished(wid, small.id, FinishReport(state="succeeded", exit_code=0))
    a = await take(gl_cp, wid)
    assert (a.job.id, a.node.devices) == (gang.id, [0, 1])


@pytest.fixture
async def gang_cp(tmp_path: Path, gl_clock: FakeClock) -> AsyncIterator[ControlPlane]:
    store = SqliteStore(tmp_path / "gang.db")
    await store.open()
    cp = ControlPlane(
        store,
        LocalArtifactStore(tmp_path / "blobs"),
        clock=gl_clock,
        heartbeat_timeout=3600,
        rendezvous_timeout=30,
    )
    await cp.start()
    yield cp
    await cp.close()
    await store.close()


async def test_a_gang_whose_rendezvous_never_comes_fails_after_the_timeout(
    gang_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    a, b = await join(gang_cp, "a", gpus=1), await join(gang_cp, "b", gpus=1)
    job = await gang_cp.submit(cmd("true", resources=Resources(gpus=1, nodes=2)))
    await take(gang_cp, a)
    await take(gang_cp, b)
    waiting = asyncio.ensure_future(gang_cp.get_rendezvous(b, job.id, wait=3600))
    await gl_clock.advance(29)
    assert (await gang_cp.get(job.id)).state == JobState.PLACED
    await advance_until(gl_clock, await state_is(gang_cp, job.id, JobState.FAILED), 1, 30)
    done = await gang_cp.get(job.id)
    assert done.reason is not None and "rendezvous did not complete within 30s" in done.reason
    with pytest.raises(Conflict):
        await asyncio.wait_for(waiting, 10)
    # Both workers are told to stop their part.
    for wid in (a, b):
        assert job.id in (await gang_cp.next_work(wid)).cancel


async def test_a_published_rendezvous_reaches_the_other_rank_and_keeps_the_gang(
    gang_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    a, b = await join(gang_cp, "a", gpus=1), await join(gang_cp, "b", gpus=1)
    job = await gang_cp.submit(cmd("true", resources=Resources(gpus=1, nodes=2)))
    ranks = {
        x.node.worker_id: x.node.node_rank for x in [await take(gang_cp, a), await take(gang_cp, b)]
    }
    first, other = (a, b) if ranks[a] == 0 else (b, a)
    waiting = asyncio.ensure_future(gang_cp.get_rendezvous(other, job.id, wait=3600))
    await gl_clock.advance(5)
    rdzv = Rendezvous(master_addr="10.0.0.1", master_port=29500)
    await gang_cp.publish_rendezvous(first, job.id, rdzv)
    assert await asyncio.wait_for(waiting, 10) == rdzv
    await gl_clock.advance(60)
    assert (await gang_cp.get(job.id)).state == JobState.PLACED
    for wid in (first, other):
        await gang_cp.report_started(wid, job.id)
    for wid in (first, other):
        await gang_cp.report_finished(
            wid, job.id, FinishReport(state="succeeded", exit_code=0, result=wid)
        )
    done = await gang_cp.get(job.id)
    assert (done.state, done.result) == (JobState.SUCCEEDED, first)  # rank 0's result


async def test_long_polls_return_when_the_clock_passes_their_wait(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    wid = await join(gl_cp)
    spec = cmd("true", resources=Resources(worker="elsewhere"), wait_for_capacity=True)
    job = await gl_cp.submit(spec)
    await until(lambda: gl_cp.jobs.active_job(job.id).pending)  # type: ignore[union-attr]
    # Within one heartbeat timeout, so the reaper leaves the (silent) worker alone.
    wait = HEARTBEAT * 0.75
    polls = [
        asyncio.ensure_future(gl_cp.next_work(wid, wait=wait)),
        asyncio.ensure_future(gl_cp.logs(job.id, since=10, wait=wait)),
        asyncio.ensure_future(gl_cp.events(cursor=await gl_cp.event_cursor(), wait=wait)),
        asyncio.ensure_future(gl_cp.wait(job.id, timeout=wait)),
    ]
    await gl_clock.advance(wait - 0.1)
    assert not any(p.done() for p in polls)
    await gl_clock.advance(0.1)
    work, logs, events, waited = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert work.assignments == [] and logs.records == []
    assert waited.state == JobState.QUEUED
    assert events.events == [] and not events.reset


async def test_a_cursor_from_before_a_restart_asks_for_a_refetch(
    tmp_path: Path, gl_clock: FakeClock
) -> None:
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    blobs = LocalArtifactStore(tmp_path / "blobs")
    first = ControlPlane(store, blobs, clock=gl_clock)
    await first.start()
    await first.cancel((await first.submit(cmd("true"))).id)
    old = await first.event_cursor()
    await first.close()
    second = ControlPlane(store, blobs, clock=gl_clock)
    await second.start()
    try:
        page = await second.events(cursor=old)
        assert page.reset and page.cursor.split(":")[0] != old.split(":")[0]
        # Following on from the page's cursor is quiet until something happens.
        here = await second.event_cursor()
        assert (await second.events(cursor=here)).events == []
        job = await second.submit(cmd("true"))
        page = await second.events(cursor=here)
        assert not page.reset and {e.job.id for e in page.events if e.job} == {job.id}
    finally:
        await second.close()
        await store.close()
