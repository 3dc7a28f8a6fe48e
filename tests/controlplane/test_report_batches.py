"""A worker's batch of reports is one flush (issue 25): one write of every job it ends, each
job stored before any of its waiters wakes (a log line of the batch included) and before the
batch is answered, one event per end, and the worker's usage right at every read.

Workers are played by the test on a fake clock, over a real SQLite store that counts the job
writes it is given and can be made unreachable (a fake over the real thing, no mock).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    CostEntry,
    FinishReport,
    Job,
    JobReport,
    JobSpec,
    JobState,
    LogLine,
    WorkerRegistration,
    WorkerState,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import Conflict, Unavailable
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, until

from .stores import AwayStore

JOBS = 5


class CountingStore(SqliteStore):
    """SQLite that remembers each write of jobs (the ids it carried), and can be down."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[list[str]] = []
        self.down = False

    def _check(self, jobs: Sequence[Job]) -> None:
        if self.down:
            raise Unavailable("the database is away (on purpose)")
        self.writes.append([j.id for j in jobs])

    async def save_jobs(self, jobs: Sequence[Job]) -> None:
        self._check(jobs)
        await super().save_jobs(jobs)

    async def save_jobs_and_costs(self, jobs: Sequence[Job], entries: Sequence[CostEntry]) -> None:
        self._check(jobs)
        await super().save_jobs_and_costs(jobs, entries)


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, CountingStore]]:
    store = CountingStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"), clock=FakeClock())
    await cp.start()
    try:
        yield cp, store
    finally:
        await cp.close()
        await store.close()


async def placed(cp: ControlPlane, n: int = JOBS) -> tuple[str, list[Job]]:
    """A remote worker holding ``n`` placed jobs (in submit order)."""
    wid = (await cp.register(WorkerRegistration(name="w1", transport="http"))).id
    jobs = [await cp.submit(JobSpec(workload=CommandWorkload(argv=["true"]))) for _ in range(n)]
    taken: set[str] = set()
    while len(taken) < n:
        work = await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
        taken.update(a.job.id for a in work.assignments)
    return wid, jobs


def ended(job: Job, *, lines: int = 0) -> JobReport:
    """A short job's whole life in one entry: started, its lines, its end."""
    return JobReport(
        job_id=job.id,
        attempt=0,
        started=True,
        lines=[LogLine(time=0, stream="stdout", text=f"{job.id} {i}") for i in range(lines)],
        finished=FinishReport(state="succeeded", exit_code=0, attempt=0),
    )


async def test_a_batch_of_ends_is_one_write_stored_before_anyone_hears_of_it(
    counted: tuple[ControlPlane, CountingStore],
) -> None:
    cp, store = counted
    wid, jobs = await placed(cp)
    worker = cp.registry.get(wid)
    assert worker is not None and worker.state == WorkerState.BUSY
    assert worker.running == sorted(j.id for j in jobs)
    seen: dict[str, Job | None] = {}

    async def waiter(job_id: str) -> None:
        done = await cp.wait(job_id, timeout=60)
        assert done.state == JobState.SUCCEEDED
        seen[job_id] = await store.get_job(job_id)  # woken: it must be stored already

    waiting = [asyncio.create_task(waiter(j.id)) for j in jobs]

    def parked(job_id: str) -> bool:  # its waiter awaits the job's signal (JobTable.wait)
        signal = cp.jobs._signals._by_key.get(job_id)
        return signal is not None and signal.waiting > 0

    await until(lambda: all(parked(j.id) for j in jobs), 10, what="every waiter to wait")
    since = cp.event_log.seq
    store.writes.clear()
    entries = [ended(j, lines=i % 2) for i, j in enumerate(jobs)]
    answers = await cp.report(wid, [*entries, ended(jobs[0]).model_copy(update={"job_id": "nope"})])

    assert answers[:JOBS] == [None] * JOBS
    assert isinstance(answers[JOBS], Conflict)  # the bad entry only is refused
    # One write carries every end (each start folded into its end).
    assert [sorted(w) for w in store.writes] == [sorted(j.id for j in jobs)]
    for j in jobs:  # stored when the batch is answered
        stored = await store.get_job(j.id)
        assert stored is not None and stored.state == JobState.SUCCEEDED
    await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert {i: s and s.state for i, s in seen.items()} == {j.id: JobState.SUCCEEDED for j in jobs}
    # One event per end (in the order staged); the worker's last one says it is idle.
    page = await cp.event_log.page(since)
    ends = [e.job.id for e in page.events if e.job is not None and e.job.state.terminal]
    assert sorted(ends) == sorted(j.id for j in jobs)
    last = [e.worker for e in page.events if e.worker is not None][-1]
    assert (last.running, last.device_jobs, last.state) == ([], {}, WorkerState.READY)
    worker = cp.registry.get(wid)
    assert worker is not None and (worker.running, worker.state) == ([], WorkerState.READY)


async def test_the_worker_s_usage_is_recounted_whenever_what_it_holds_changed(
    counted: tuple[ControlPlane, CountingStore],
) -> None:
    cp, _ = counted
    wid, jobs = await placed(cp)
    for n in range(1, JOBS + 1):  # one end a report: each read says what is left
        assert await cp.report(wid, [ended(jobs[n - 1])]) == [None]
        worker = cp.registry.get(wid)
        assert worker is not None
        assert worker.running == sorted(j.id for j in jobs[n:])
        assert worker.state == (WorkerState.BUSY if n < JOBS else WorkerState.READY)
    more = await cp.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
    await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
    worker = cp.registry.get(wid)
    assert worker is not None and (worker.running, worker.state) == ([more.id], WorkerState.BUSY)


async def test_a_batch_the_store_cannot_take_refuses_the_entries_it_carried(
    counted: tuple[ControlPlane, CountingStore],
) -> None:
    cp, store = counted
    wid, jobs = await placed(cp, 3)
    store.down = True
    lines_only = JobReport(
        job_id=jobs[2].id, attempt=0, lines=[LogLine(time=0, stream="stdout", text="x")]
    )
    answers = await cp.report(wid, [ended(jobs[0]), ended(jobs[1]), lines_only])
    assert [type(a) for a in answers[:2]] == [Unavailable, Unavailable]
    assert answers[2] is None  # it changed no job: its lines are taken
    assert {jobs[0].id, jobs[1].id} <= cp.jobs.dirty  # kept, to be written later
    store.down = False
    # An end sent again is taken once it is stored (and the other one with it): nothing lost.
    again = FinishReport(state="succeeded", exit_code=0, attempt=0)
    assert (await cp.report_finished(wid, jobs[0].id, again)).state == JobState.SUCCEEDED
    for j in jobs[:2]:
        stored = await store.get_job(j.id)
        assert stored is not None and stored.state == JobState.SUCCEEDED
    assert not cp.jobs.dirty


@pytest.fixture
async def away(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, AwayStore, FakeClock]]:
    store = AwayStore(tmp_path / "cp.db")
    await store.open()
    clock = FakeClock()
    cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"), clock=clock)
    await cp.start()
    try:
        yield cp, store, clock
    finally:
        await cp.close()
        await store.close()


async def stored_lines(store: SqliteStore, job_id: str) -> list[tuple[int, str]]:
    return [(r.seq, r.text) for r in await store.read_logs(job_id, 0, 100) if r.stream == "stdout"]


async def test_lines_the_store_could_not_take_are_written_once_it_answers(
    away: tuple[ControlPlane, AwayStore, FakeClock],
) -> None:
    """A worker does not send refused lines again: lost, before, with a gap in the numbering
    (a running job's) or the end refused as no longer running (an ended job's)."""
    cp, store, clock = away
    wid, (running, ending) = await placed(cp, 2)
    lines = [LogLine(time=0, stream="stdout", text=f"a{i}") for i in range(2)]
    store.down = True
    answers = await cp.report(
        wid,
        [
            JobReport(job_id=running.id, attempt=0, started=True, lines=lines),
            ended(ending, lines=2),
        ],
    )
    assert [type(a) for a in answers] == [Unavailable, Unavailable]  # not stored when answered
    assert cp.tails.unsaved == 4
    await clock.advance(1.0)  # a retry while it is still away: kept
    assert cp.tails.unsaved == 4 and await stored_lines(store, running.id) == []
    store.down = False
    await clock.advance(10.0)  # the next retry: its write goes to the store's thread
    await until(lambda: cp.tails.unsaved == 0, 10, what="the kept lines to be written")
    await until(lambda: not cp.jobs.dirty, 10, what="the kept end to be written")
    assert await stored_lines(store, running.id) == [(2, "a0"), (3, "a1")]  # 1: "placed on"
    assert await stored_lines(store, ending.id) == [(2, f"{ending.id} 0"), (3, f"{ending.id} 1")]
    done = await store.get_job(ending.id)  # its end, kept dirty, written too
    assert done is not None and done.state == JobState.SUCCEEDED
    # The running job's next lines number on from the kept ones.
    more = [LogLine(time=0, stream="stdout", text="b")]
    assert await cp.report(wid, [JobReport(job_id=running.id, attempt=0, lines=more)]) == [None]
    assert (await stored_lines(store, running.id))[-1] == (4, "b")


async def test_lines_a_worker_sends_again_are_not_kept_twice(
    away: tuple[ControlPlane, AwayStore, FakeClock],
) -> None:
    """A worker's single log request (and a cell report) is retried on a 503, lines and all:
    those are not kept, or they would be stored twice."""
    cp, store, clock = away
    wid, (job,) = await placed(cp, 1)
    lines = [LogLine(time=0, stream="stdout", text="once")]
    store.down = True
    with pytest.raises(Unavailable):
        await cp.append_logs(wid, job.id, lines, 0)
    assert cp.tails.unsaved == 0
    store.down = False
    await cp.append_logs(wid, job.id, lines, 0)  # the worker's retry
    await clock.advance(30.0)
    # Numbered as if the refused try had not been (2: "placed on" is 1), and shown once.
    assert await stored_lines(store, job.id) == [(2, "once")]
    page = [(r.seq, r.stream, r.text) for r in (await cp.logs(job.id)).records]
    assert [(seq, text) for seq, stream, text in page if stream == "stdout"] == [(2, "once")]


async def test_a_closing_control_plane_writes_what_the_outage_kept(
    away: tuple[ControlPlane, AwayStore, FakeClock],
) -> None:
    """The store came back, but the retry loop's next try is seconds away when the control
    plane is stopped: its close writes the kept lines and the kept end, not drops them."""
    cp, store, clock = away
    wid, (running, ending) = await placed(cp, 2)
    lines = [LogLine(time=0, stream="stdout", text=f"a{i}") for i in range(2)]
    store.down = True
    await cp.report(
        wid,
        [
            JobReport(job_id=running.id, attempt=0, started=True, lines=lines),
            ended(ending, lines=2),
        ],
    )
    assert cp.tails.unsaved == 4 and ending.id in cp.jobs.dirty
    store.down = False  # back, and no retry has run yet (the clock has not moved)
    await cp.close()
    assert await stored_lines(store, running.id) == [(2, "a0"), (3, "a1")]
    done = await store.get_job(ending.id)
    assert done is not None and done.state == JobState.SUCCEEDED


async def test_a_control_plane_closing_during_an_outage_says_what_is_lost(
    away: tuple[ControlPlane, AwayStore, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    cp, store, clock = away
    wid, (running,) = await placed(cp, 1)
    lines = [LogLine(time=0, stream="stdout", text=f"a{i}") for i in range(3)]
    store.down = True
    await cp.report(wid, [JobReport(job_id=running.id, attempt=0, started=True, lines=lines)])
    assert cp.tails.unsaved == 3
    with caplog.at_level(logging.WARNING, logger="gpulayer.controlplane"):
        await cp.close()
    said = [r.getMessage() for r in caplog.records]
    assert any("closing with 3 log lines the store has not taken" in m for m in said), said
    assert any("they are lost" in m and "job changes" in m for m in said), said
