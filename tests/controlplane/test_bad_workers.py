"""Bad and dead workers (issue 12, items 1, 9 and 15), on a FakeClock with workers played by the
test: one worker whose data breaks a scheduling pass is set aside and the rest go on; admins
remove workers; a closed connection makes a worker suspect; a placed job on a lost worker goes
back to the queue; a gang names the worker that died; a job that can never fit fails at once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from gpulayer_kernel import render
from gpulayer_kernel.contracts import (
    CommandWorkload,
    FinishReport,
    HostFacts,
    JobSpec,
    JobState,
    Reason,
    Resources,
    WorkerCapabilities,
    WorkerRegistration,
    WorkerState,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import Conflict
from gpulayer_kernel.scheduler import cache as scheduler_cache
from gpulayer_kernel.scheduler.feasible import Profile, derive_profile
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import sim_caps

# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


async def join(
    cp: ControlPlane, name: str, gpus: int = 0, host: str = "", worker_id: str | None = None
) -> str:
    caps = sim_caps(gpus) if gpus else WorkerCapabilities()
    if host:
        caps = caps.model_copy(update={"host": HostFacts(hostname=host)})
    reg = WorkerRegistration(name=name, capabilities=caps, transport="http")
    return (await cp.register(reg, worker_id)).id


def state_is(cp: ControlPlane, job_id: str, *states: JobState) -> Callable[[], object]:
    async def check() -> bool:
        return (await cp.get(job_id)).state in states

    return check


async def take(cp: ControlPlane, worker_id: str) -> None:
    """Take the worker's next assignment (its long-poll answers when a pass hands one out)."""
    work = await asyncio.wait_for(cp.next_work(worker_id, wait=3600), 10)
    assert work.assignments


# -- item 1: one bad worker does not stop the cluster -------------------------------------------


@pytest.fixture
def bad_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deriving the profile of a worker on host "bad" raises, as `1 << 10**12` did."""

    def derive(caps: WorkerCapabilities, uid: int = 0) -> Profile:
        if caps.host.hostname == "bad":
            raise MemoryError("a device index of 10**12")
        return derive_profile(caps, uid)

    monkeypatch.setattr(scheduler_cache, "derive_profile", derive)


@pytest.mark.usefixtures("bad_host")
async def test_a_worker_that_breaks_a_pass_is_set_aside_and_the_rest_go_on(
    gl_cp: ControlPlane,
) -> None:
    bad = await join(gl_cp, "bad", gpus=1, host="bad")
    good = await join(gl_cp, "good", gpus=1)
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))
    await until(state_is(gl_cp, job.id, JobState.PLACED), what="the job to be placed")
    placed = await gl_cp.get(job.id)
    assert placed.placement is not None and placed.placement.worker_ids == [good]
    w = gl_cp.registry.require(bad)
    assert w.unschedulable is not None and "MemoryError" in w.unschedulable
    assert not w.schedulable and w.live
    table = render.workers_table(await gl_cp.workers())
    assert "unschedulable: a scheduling pass failed on it: MemoryError" in table
    # A waiting job counts it under its own reason; waiting for it won't help.
    waiting = await gl_cp.submit(cmd("true", resources=Resources(gpus=1), wait_for_capacity=True))

    async def reported() -> bool:
        return (await gl_cp.get(waiting.id)).pending is not None

    await until(reported, what="a report for the waiting job")
    report = (await gl_cp.get(waiting.id)).pending
    assert report is not None
    assert {rc.code: rc.workers for rc in report.filtered} == {Reason.UNSCHEDULABLE: 1}
    assert "1 is set aside as unschedulable" in report.sentence
    # Joining again with new data clears the mark.
    await join(gl_cp, "bad", gpus=1, worker_id=bad)
    assert gl_cp.registry.require(bad).unschedulable is None


async def test_removing_a_worker(gl_cp: ControlPlane) -> None:
    wid = await join(gl_cp, "w1", gpus=1)
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))
    await take(gl_cp, wid)
    with pytest.raises(Conflict) as refused:
        await gl_cp.remove_worker("w1")
    assert refused.value.code == "worker_busy" and job.id in refused.value.message
    gone = await gl_cp.remove_worker("w1", force=True)  # by name
    assert gone.id == wid
    assert gl_cp.registry.get(wid) is None
    assert wid not in [w.id for w in await gl_cp.store.load_workers()]
    # It never started: back in the queue, not lost.
    await until(state_is(gl_cp, job.id, JobState.QUEUED), what="the job to be queued again")
    with pytest.raises(Exception, match="no worker"):
        await gl_cp.remove_worker(wid)


async def test_a_rejoin_under_the_same_name_keeps_one_row(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    old = await join(gl_cp, "w1")
    await gl_cp.deregister(old)
    new = await join(gl_cp, "w1")  # a new id (a join token never takes an old one)
    assert new != old
    assert [(w.name, w.id) for w in await gl_cp.workers()] == [("w1", new)]
    assert [w.id for w in await gl_cp.store.load_workers()] == [new]


# -- item 9: a dead worker is called dead -------------------------------------------------------


async def test_a_closed_connection_makes_a_worker_suspect_until_it_calls_again(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.registry.suspect_grace = 0.5
    wid = await join(gl_cp, "w1", gpus=1)
    gl_cp.worker_disconnected(wid)
    await gl_clock.advance(0.6)
    w = gl_cp.registry.require(wid)
    assert w.suspect is not None and "connection closed" in w.suspect and w.live
    assert "suspect: its connection closed" in render.workers_table(await gl_cp.workers())
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))

    async def waits_for_it() -> bool:
        report = (await gl_cp.get(job.id)).pending
        return report is not None and report.exhausted[0].code == Reason.WORKER_SUSPECT

    await until(waits_for_it, what="the job to wait for the suspect worker")
    assert (await gl_cp.get(job.id)).state == JobState.QUEUED  # waiting helps: not failed
    gl_cp.registry.heartbeat(wid)  # it called again
    await until(state_is(gl_cp, job.id, JobState.PLACED), what="the job to be placed on it")
    assert gl_cp.registry.require(wid).suspect is None


async def test_a_closed_connection_does_not_count_while_another_poll_is_open(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.registry.suspect_grace = 0.5
    wid = await join(gl_cp, "w1")
    poll = asyncio.ensure_future(gl_cp.next_work(wid, wait=3600))
    await until(lambda: gl_cp.registry.polls(wid) == 1, what="the poll to open")
    gl_cp.worker_disconnected(wid)  # an older connection, closing late
    await gl_clock.advance(0.6)
    assert gl_cp.registry.require(wid).suspect is None
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll


async def test_a_placed_job_on_a_lost_worker_goes_back_to_the_queue(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    dead = await join(gl_cp, "dead", gpus=1)
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=1)))  # no retries
    await take(gl_cp, dead)
    other = await join(gl_cp, "other", gpus=1)
    # Only "other" heartbeats; "dead" is declared lost at the heartbeat timeout.
    for _ in range(6):
        gl_cp.registry.heartbeat(other)
        await gl_clock.advance(0.5)
    await take(gl_cp, other)
    assert gl_cp.registry.require(other).live
    assert not gl_cp.registry.get(dead).live  # type: ignore[union-attr]
    placed = await gl_cp.get(job.id)
    assert placed.state == JobState.PLACED and placed.placement is not None
    assert placed.placement.worker_ids == [other]
    assert placed.attempts == 1 and placed.requeues == 1  # a new attempt, not a used retry
    logs = (await gl_cp.logs(job.id)).records
    assert any("worker dead was lost" in r.text and "back in the queue" in r.text for r in logs)


async def test_a_gang_that_lost_a_peer_names_the_worker_that_died(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.registry.suspect_grace = 0.5
    w1 = await join(gl_cp, "w1", gpus=1)
    w2 = await join(gl_cp, "w2", gpus=1)
    job = await gl_cp.submit(cmd("train", resources=Resources(gpus=1, nodes=2)))
    await take(gl_cp, w1)
    await take(gl_cp, w2)
    await gl_cp.report_started(w1, job.id)
    gl_cp.worker_disconnected(w2)  # killed: its long-poll's connection closed unanswered
    report = FinishReport(state="failed", exit_code=1, reason="lost a peer (look at the other)")
    failed = await gl_cp.report_finished(w1, job.id, report)
    assert failed.state == JobState.LOST  # issue 36: the gang is lost, as docs/distributed.md says
    assert failed.reason is not None and failed.reason.startswith("worker w2 was lost (its ")
    assert re.search(r"; node \d \(w1\): lost a peer", failed.reason)
    # The dead worker takes nothing new meanwhile.
    await gl_clock.advance(0.6)
    assert gl_cp.registry.require(w2).suspect is not None
    gang = await gl_cp.submit(cmd("train", resources=Resources(gpus=1, nodes=2)))

    async def waiting() -> bool:
        return (await gl_cp.get(gang.id)).pending is not None

    await until(waiting, what="the new gang to wait")
    assert (await gl_cp.get(gang.id)).state == JobState.QUEUED


# -- item 15: a job that can never fit says so, at once -----------------------------------------


async def test_a_job_that_can_never_fit_fails_at_once_saying_what_exists(
    gl_cp: ControlPlane,
) -> None:
    await join(gl_cp, "w1", gpus=2)
    await join(gl_cp, "w2")
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=4)))
    await until(state_is(gl_cp, job.id, JobState.FAILED), what="the job to fail")
    reason = (await gl_cp.get(job.id)).reason
    assert reason is not None
    assert "it needs 4 GPUs on one worker, and the largest worker has 2." in reason
    assert "waiting won't help" not in reason and "--wait" in reason
    # Asked to wait for capacity: it waits, and says so.
    waits = await gl_cp.submit(cmd("true", resources=Resources(gpus=4), wait_for_capacity=True))

    async def reported() -> bool:
        return (await gl_cp.get(waits.id)).pending is not None

    await until(reported, what="a report")
    assert (await gl_cp.get(waits.id)).state == JobState.QUEUED


async def test_without_workers_or_for_a_known_worker_a_job_waits(gl_cp: ControlPlane) -> None:
    job = await gl_cp.submit(cmd("true", resources=Resources(gpus=4)))

    async def reported(job_id: str) -> bool:
        return (await gl_cp.get(job_id)).pending is not None

    await until(lambda: reported(job.id), what="a report")
    assert (await gl_cp.get(job.id)).state == JobState.QUEUED  # a worker may join
    gone = await join(gl_cp, "box2", gpus=1)
    await gl_cp.deregister(gone)
    await join(gl_cp, "w1", gpus=1)
    named = await gl_cp.submit(cmd("true", resources=Resources(gpus=1, worker="box2")))
    await until(lambda: reported(named.id), what="a report")
    assert (await gl_cp.get(named.id)).state == JobState.QUEUED  # box2 may come back
    assert gl_cp.registry.require(gone).state == WorkerState.OFFLINE
