"""The dispatcher on its own: inboxes, cancels, returned work, rendezvous, long-polls on a clock."""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_kernel.contracts import (
    Job,
    JobAssignment,
    JobSpec,
    JobState,
    NodePlacement,
    Placement,
    Rendezvous,
    Work,
)
from gpulayer_kernel.contracts.jobs import CommandWorkload
from gpulayer_kernel.controlplane.dispatch import Dispatcher
from gpulayer_kernel.errors import Conflict
from gpulayer_kernel.testing import FakeClock

SPEC = JobSpec(workload=CommandWorkload(argv=["true"]))


def gang(job_id: str = "g" * 12, *workers: str) -> Job:
    nodes = [
        NodePlacement(worker_id=w, worker_name=w, node_rank=i)
        for i, w in enumerate(workers or ("a", "b"))
    ]
    return Job(
        id=job_id,
        seq=1,
        spec=SPEC,
        submitted_at=0,
        state=JobState.PLACED,
        placement=Placement(nodes=nodes),
    )


def started() -> tuple[Dispatcher, FakeClock, list[str]]:
    clock = FakeClock()
    d = Dispatcher(clock)
    d.open = True
    return d, clock, []


async def test_each_node_goes_to_its_worker_with_the_secrets() -> None:
    d, _, touched = started()
    job = gang()
    assert d.assign(job, {"K": "v"}) == ["a", "b"]
    work = await d.next_work("a", 0, lambda: touched.append("a"))
    [a] = work.assignments
    assert (a.job.id, a.node.worker_id, a.nnodes, a.secrets) == (job.id, "a", 2, {"K": "v"})
    assert touched == ["a"]
    assert (await d.next_work("a", 0, lambda: None)).assignments == []


async def test_the_long_poll_answers_when_work_lands_or_the_clock_runs_out() -> None:
    d, clock, touched = started()
    poll = asyncio.ensure_future(d.next_work("a", 30, lambda: touched.append("a")))
    await clock.advance(29)
    assert not poll.done()
    await clock.advance(1)
    assert await poll == Work()
    poll = asyncio.ensure_future(d.next_work("a", 30, lambda: None))
    await clock.advance(1)
    d.stop(gang(), but="b")
    assert (await poll).cancel == ["g" * 12]
    assert len(touched) >= 2  # every round is a heartbeat


async def test_returned_work_goes_back_first_and_only_for_active_jobs() -> None:
    d, _, _ = started()
    first, second, gone = gang("1" * 12, "a"), gang("2" * 12, "a"), gang("3" * 12, "a")
    d.assign(second, {})
    returned = Work(
        assignments=[*await _assignments(first), *await _assignments(gone)], cancel=["x" * 12]
    )
    d.return_work("a", returned, lambda job_id: job_id != gone.id)
    work = await d.next_work("a", 0, lambda: None)
    assert [a.job.id for a in work.assignments] == [first.id, second.id]
    assert work.cancel == ["x" * 12]


async def _assignments(job: Job) -> list[JobAssignment]:
    """What a worker would have been handed for ``job``."""
    d = Dispatcher()
    d.assign(job, {})
    return (await d.next_work(job.placement.worker_ids[0], 0, lambda: None)).assignments  # type: ignore[union-attr]


async def test_a_gone_worker_s_inbox_is_dropped() -> None:
    d, _, _ = started()
    d.assign(gang(), {})
    d.forget_worker("a")
    assert await d.next_work("a", 0, lambda: None) == Work()
    assert len((await d.next_work("b", 0, lambda: None)).assignments) == 1


async def test_rendezvous_is_published_waited_for_and_dropped_with_the_job() -> None:
    d, clock, _ = started()
    job = gang()
    waiting = asyncio.ensure_future(d.rendezvous(job.id, 60, lambda: job))
    await clock.advance(10)
    rdzv = Rendezvous(master_addr="10.0.0.1", master_port=29500)
    d.publish(job.id, rdzv)
    assert await waiting == rdzv and d.has_rendezvous(job.id)
    d.job_changed(job.model_copy(update={"state": JobState.FAILED}))
    assert not d.has_rendezvous(job.id)


async def test_rendezvous_wait_gives_up_on_the_clock_or_a_cancel() -> None:
    d, clock, _ = started()
    job = gang()
    waiting = asyncio.ensure_future(d.rendezvous(job.id, 60, lambda: job))
    await clock.advance(60)
    with pytest.raises(Conflict) as info:
        await waiting
    assert info.value.code == "rendezvous_pending"
    waiting = asyncio.ensure_future(d.rendezvous(job.id, 60, lambda: job))
    await clock.advance(1)
    job = job.model_copy(update={"cancel_requested": True})
    d.job_changed(job)
    with pytest.raises(Conflict):
        await waiting


async def test_redelivery_hands_placed_jobs_out_without_waking_anyone() -> None:
    d, _, _ = started()

    async def secrets(names: object) -> dict[str, str]:
        return {"K": "v"}

    await d.redeliver([gang()], secrets)
    [a] = (await d.next_work("b", 0, lambda: None)).assignments
    assert a.secrets == {"K": "v"}
