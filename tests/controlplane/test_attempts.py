"""Attempts have identities: stale reports are refused and stopped, cancel always ends a job, a
finished attempt is never handed out again, and secrets never reach a job's stored fields.

Control-plane tests run on a FakeClock with workers played by the test; the last one runs a real
in-process worker agent (real processes) through a lost-and-back worker.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    AttemptRef,
    CommandWorkload,
    FinishReport,
    JobAssignment,
    JobSpec,
    JobState,
    LogLine,
    Rendezvous,
    WorkerRegistration,
    WorkerState,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import Conflict
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import WorkerFactory

HEARTBEAT = 2.0
CANARY = "canary-7f3a9c1e5b"


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


class World:
    """A control plane on a fake clock, over a store that outlives it (for restarts)."""

    def __init__(self, tmp: Path, clock: FakeClock) -> None:
        self.tmp = tmp
        self.clock = clock
        self.store = SqliteStore(tmp / "cp.db")
        self.cp: ControlPlane | None = None

    async def start(self) -> ControlPlane:
        self.cp = ControlPlane(
            self.store,
            LocalArtifactStore(self.tmp / "blobs"),
            clock=self.clock,
            heartbeat_timeout=HEARTBEAT,
        )
        await self.cp.start()
        return self.cp

    async def restart(self) -> ControlPlane:
        """Stop this control plane and start a new one on the same store (as after a crash)."""
        assert self.cp is not None
        await self.cp.close()
        return await self.start()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path, FakeClock())
    await w.store.open()
    await w.start()
    yield w
    assert w.cp is not None
    await w.cp.close()
    await w.store.close()


async def join(cp: ControlPlane, name: str = "w1", worker_id: str | None = None) -> str:
    """A remote worker (an in-process one would die with its control plane at a restart)."""
    reg = WorkerRegistration(name=name, transport="http")
    return (await cp.register(reg, worker_id)).id


async def take(cp: ControlPlane, worker_id: str) -> JobAssignment:
    work = await asyncio.wait_for(cp.next_work(worker_id, wait=3600), 10)
    [a] = work.assignments
    return a


def line(text: str) -> LogLine:
    return LogLine(time=0, stream="stdout", text=text)


async def lose(world: World, worker_id: str) -> None:
    """Let the worker's heartbeat run out on the clock; the reaper declares it lost."""
    cp = world.cp
    assert cp is not None

    async def lost() -> bool:
        # A quarter heartbeat per look; ``until``'s real pauses let the store's writes land.
        await world.clock.advance(HEARTBEAT / 4)
        w = cp.registry.get(worker_id)
        return w is not None and w.state == WorkerState.LOST

    await until(lost, 20, what="the worker to be declared lost")


async def test_a_paused_worker_s_stale_attempt_is_refused_stopped_and_kept_apart(
    world: World,
) -> None:
    """The issue's case, played by hand: attempt 0 is lost, the worker comes back, attempt 1 is
    placed on it; attempt 0's late reports are refused without harm and it is told to stop."""
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    job = await cp.submit(cmd("sleep", "30", retries=1, retry_backoff=0))
    first = await take(cp, wid)
    assert first.attempt == 0
    await cp.report_started(wid, job.id, attempt=0)
    await cp.append_logs(wid, job.id, [line("from attempt 0")], attempt=0)
    await lose(world, wid)  # paused past the heartbeat timeout
    await until(lambda: cp.jobs.active_job(job.id).attempts == 1)  # type: ignore[union-attr]
    # The worker comes back (its session keeps its id) and is handed attempt 1.
    await join(cp, worker_id=wid)
    back = await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
    assert back.stop == [AttemptRef(job_id=job.id, attempt=0)]  # what it ran before: stop it
    second = back.assignments[0] if back.assignments else await take(cp, wid)
    assert (second.job.id, second.attempt) == (job.id, 1)

    # Every report of attempt 0 is refused with one code, and changes nothing.
    late = [
        cp.report_started(wid, job.id, attempt=0),
        cp.append_logs(wid, job.id, [line("late line of attempt 0")], attempt=0),
        cp.report_progress(wid, job.id, {"step": 9}, attempt=0),
        cp.report_finished(wid, job.id, FinishReport(state="succeeded", exit_code=0, attempt=0)),
        cp.publish_rendezvous(wid, job.id, Rendezvous(master_addr="x", master_port=1, attempt=0)),
    ]
    for call in late:
        with pytest.raises(Conflict) as info:
            await call
        assert info.value.code == "stale_attempt" and info.value.status == 409
    now = await cp.get(job.id)
    assert (now.state, now.attempts, now.progress) == (JobState.PLACED, 1, None)
    # The worker is told to stop exactly that attempt (not the job).
    work = await cp.next_work(wid)
    assert work.stop == [AttemptRef(job_id=job.id, attempt=0)] and work.cancel == []

    # Attempt 1 runs and ends the job; its lines come after the mark of the new attempt.
    await cp.report_started(wid, job.id, attempt=1)
    await cp.append_logs(wid, job.id, [line("from attempt 1")], attempt=1)
    done = await cp.report_finished(
        wid, job.id, FinishReport(state="succeeded", exit_code=0, attempt=1)
    )
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1)
    texts = [r.text for r in (await cp.logs(job.id)).records]
    mark = next(i for i, t in enumerate(texts) if t.startswith("attempt 1 failed"))
    assert texts.index("from attempt 0") < mark < texts.index("from attempt 1")
    assert "late line of attempt 0" not in texts
    # A repeated report of the attempt that finished is still idempotent; a stale one is not.
    again = FinishReport(state="succeeded", exit_code=0, attempt=1)
    assert (await cp.report_finished(wid, job.id, again)).state == JobState.SUCCEEDED
    with pytest.raises(Conflict) as info:
        await cp.report_finished(wid, job.id, FinishReport(state="failed", attempt=0))
    assert info.value.code == "stale_attempt"


async def test_a_report_without_an_attempt_means_the_current_one(world: World) -> None:
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    job = await cp.submit(cmd("true"))
    await take(cp, wid)
    await cp.report_started(wid, job.id)
    await cp.append_logs(wid, job.id, [line("an older worker")])
    done = await cp.report_finished(wid, job.id, FinishReport(state="succeeded", exit_code=0))
    assert done.state == JobState.SUCCEEDED


async def advance_and_look(world: World, cp: ControlPlane, wid: str, job_id: str) -> bool:
    """Half a fake second per look, the worker heartbeating: has the job ended? Between looks
    ``until`` pauses for real, so the reaper's store writes (thread hops, which no fake clock
    moves) land before time moves on again."""
    await world.clock.advance(0.5)
    await cp.heartbeat(wid)
    return (await cp.get(job_id)).state.terminal


async def test_cancel_ends_a_placed_job_whose_worker_never_confirms(world: World) -> None:
    cp = world.cp
    assert cp is not None
    cp.outcomes.cancel_timeout = 10
    wid = await join(cp)
    job = await cp.submit(cmd("sleep", "30"))
    await take(cp, wid)  # handed out, but the worker never starts it nor answers the cancel
    asked = await cp.cancel(job.id)
    assert (asked.state, asked.cancel_requested) == (JobState.PLACED, True)
    assert job.id in (await cp.next_work(wid)).cancel
    for _ in range(18):  # 9 s: the worker heartbeats but stays silent about the job
        await world.clock.advance(0.5)
        await cp.heartbeat(wid)
    assert (await cp.get(job.id)).state == JobState.PLACED
    await until(lambda: advance_and_look(world, cp, wid, job.id), 20, what="the cancel deadline")
    done = await cp.get(job.id)
    assert (done.state, done.reason) == (JobState.CANCELLED, "cancelled by user")
    system = [r.text for r in (await cp.logs(job.id)).records if r.stream == "system"]
    assert any("did not confirm the stop within 10s" in t for t in system)
    # The worker's late confirmation changes nothing.
    late = await cp.report_finished(wid, job.id, FinishReport(state="cancelled", attempt=0))
    assert late.state == JobState.CANCELLED


async def test_a_pending_cancel_survives_a_restart(world: World) -> None:
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    job = await cp.submit(cmd("sleep", "30"))
    await take(cp, wid)
    await cp.cancel(job.id)
    cp = await world.restart()
    cp.outcomes.cancel_timeout = 10  # the deadline starts over at the restart
    await join(cp, worker_id=wid)
    work = await cp.next_work(wid)
    assert job.id in work.cancel  # told again to stop it
    await until(lambda: advance_and_look(world, cp, wid, job.id), 20, what="the cancel deadline")
    assert (await cp.get(job.id)).state == JobState.CANCELLED


async def test_cancel_ends_a_job_at_once_when_its_worker_is_gone(world: World) -> None:
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    job = await cp.submit(cmd("sleep", "30"))
    await take(cp, wid)
    cp.registry.mark_gone(wid)  # gone, and its jobs not yet settled
    done = await cp.cancel(job.id)
    assert done.state == JobState.CANCELLED


async def test_cancel_ends_a_running_job_once_the_worker_confirms(world: World) -> None:
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    job = await cp.submit(cmd("sleep", "30"))
    await take(cp, wid)
    await cp.report_started(wid, job.id, attempt=0)
    assert (await cp.cancel(job.id)).state == JobState.RUNNING
    assert job.id in (await cp.next_work(wid)).cancel
    report = FinishReport(state="cancelled", exit_code=143, attempt=0)
    assert (await cp.report_finished(wid, job.id, report)).state == JobState.CANCELLED


async def test_a_finished_attempt_redelivered_after_a_restart_is_never_handed_out(
    world: World,
) -> None:
    """The soak's double run: a job loaded `placed` at restart is redelivered; its worker's
    retried started/finished reports win the race; the stale copy must not go out."""
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    done_job = await cp.submit(cmd("true"))
    started_job = await cp.submit(cmd("true"))
    taken: list[JobAssignment] = []
    while len(taken) < 2:
        taken += (await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)).assignments
    # The control plane dies before the worker's reports reach it; both are loaded placed.
    cp = await world.restart()
    assert {j.state for j in cp.jobs.active()} == {JobState.PLACED}
    await join(cp, worker_id=wid)  # the worker re-joins with its session
    # Its reports, retried through the restart, land before its next poll (named or not, the
    # attempt is the current one).
    await cp.report_started(wid, done_job.id)
    await cp.report_finished(wid, done_job.id, FinishReport(state="succeeded", exit_code=0))
    await cp.report_started(wid, started_job.id)
    work = await cp.next_work(wid)
    assert work.assignments == []  # neither the finished nor the started attempt runs again
    assert (await cp.get(done_job.id)).state == JobState.SUCCEEDED


async def test_returned_work_of_a_job_that_ended_meanwhile_is_dropped(world: World) -> None:
    cp = world.cp
    assert cp is not None
    wid = await join(cp)
    job = await cp.submit(cmd("true"))
    work = await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
    await cp.cancel(job.id)
    await cp.report_finished(wid, job.id, FinishReport(state="cancelled"))
    cp.return_work(wid, work)  # the long-poll's client had left: the work comes back
    assert (await cp.next_work(wid)).assignments == []


async def test_secrets_are_masked_in_results_progress_and_events(world: World) -> None:
    cp = world.cp
    assert cp is not None
    await cp.set_secret("CANARY", CANARY)
    wid = await join(cp)
    job = await cp.submit(cmd("true", secrets=["CANARY"]))
    a = await take(cp, wid)
    assert a.secrets == {"CANARY": CANARY}  # the worker still gets the value itself
    since = (await cp.events()).next_since
    await cp.report_started(wid, job.id)
    # A worker that did not mask (an older one, or a bug): the server masks again.
    await cp.report_progress(wid, job.id, {"token": CANARY, "deep": [{"k": f"x{CANARY}y"}]})
    progress = (await cp.get(job.id)).progress
    assert progress == {"token": "***", "deep": [{"k": "x***y"}]}
    report = FinishReport(
        state="succeeded", exit_code=0, result={"env": CANARY, "list": [CANARY, 1]}, reason=CANARY
    )
    done = await cp.report_finished(wid, job.id, report)
    assert done.result == {"env": "***", "list": ["***", 1]} and done.reason == "***"
    stored = await world.store.get_job(job.id)
    assert stored is not None and stored.result == done.result
    for served in (await cp.get(job.id), *(await cp.list())):
        assert CANARY not in served.model_dump_json()
    page = await cp.events(since=since)
    assert page.events and all(CANARY not in e.model_dump_json() for e in page.events)


# -- a real worker agent (in-process, real processes) ------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_worker_holding_a_stale_attempt_takes_the_new_one(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Attempt 0 runs (and would sleep on); its worker is declared lost and comes back; attempt
    1 is placed on it: the agent stops attempt 0's process and runs attempt 1 to the end."""
    agent = await gl_worker(name="w1")
    pids = tmp_path / "pids"
    script = (
        f'echo $$ > {pids}.$GPULAYER_ATTEMPT; [ "$GPULAYER_ATTEMPT" = 0 ] && exec sleep 60; exit 0'
    )
    job = await gl_cp.submit(cmd("sh", "-c", script, retries=1, retry_backoff=0))
    await until(lambda: Path(f"{pids}.0").exists() and Path(f"{pids}.0").read_text(), 30)
    pid0 = int(Path(f"{pids}.0").read_text())
    await until(lambda: gl_cp.jobs.active_job(job.id).state == JobState.RUNNING, 10)  # type: ignore[union-attr]
    assert agent.info is not None
    await gl_cp.reaper.lose(agent.info.id, "it was paused")  # as the reaper does
    done = await gl_cp.wait(job.id, timeout=60)
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1), done
    await until(lambda: not _alive(pid0), 30)
