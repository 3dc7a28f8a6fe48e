"""The event log on its own: numbering, cursors with an epoch, resets, and its long-poll."""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_kernel.contracts import Job, JobSpec, WorkerInfo
from gpulayer_kernel.contracts.jobs import CommandWorkload
from gpulayer_kernel.controlplane.events import EventLog
from gpulayer_kernel.errors import InvalidInput
from gpulayer_kernel.testing import FakeClock

SPEC = JobSpec(workload=CommandWorkload(argv=["true"]))


def job(i: int) -> Job:
    return Job(id=f"job{i:09d}", seq=i, spec=SPEC, submitted_at=0.0)


def started(maxlen: int = 100) -> tuple[EventLog, FakeClock]:
    clock = FakeClock()
    log = EventLog(clock, maxlen=maxlen)
    log.open = True
    return log, clock


async def test_events_are_numbered_and_the_cursor_names_the_epoch() -> None:
    log, clock = started()
    assert log.cursor() == f"{log.epoch}:0"
    log.job(job(1))
    log.worker(WorkerInfo(id="w", name="w", registered_at=0.0, last_heartbeat=0.0))
    page = await log.page()
    assert [(e.seq, e.kind) for e in page.events] == [(1, "job"), (2, "worker")]
    assert page.events[0].time == clock.now()
    assert (page.cursor, page.next_since, page.reset) == (f"{log.epoch}:2", 2, False)


async def test_each_log_has_its_own_random_epoch() -> None:
    assert len({EventLog().epoch for _ in range(20)}) == 20


async def test_a_cursor_returns_only_what_came_after_it() -> None:
    log, _ = started()
    log.job(job(1))
    here = log.cursor()
    log.job(job(2))
    page = await log.page(cursor=here)
    assert [e.seq for e in page.events] == [2] and not page.reset
    assert (await log.page(cursor=page.cursor)).events == []


async def test_a_cursor_from_another_epoch_asks_for_a_refetch() -> None:
    old, _ = started()
    old.job(job(1))
    stale = old.cursor()
    new, _ = started()
    new.job(job(1))
    page = await new.page(cursor=stale)
    assert page.reset and page.events == [] and page.cursor == new.cursor()


async def test_dropped_events_ask_for_a_refetch() -> None:
    log, _ = started(maxlen=3)
    log.job(job(1))
    here = log.cursor()
    for i in range(2, 7):
        log.job(job(i))
    page = await log.page(cursor=here)
    assert page.reset and [e.seq for e in page.events] == [4, 5, 6]


async def test_since_still_works_for_old_clients() -> None:
    log, _ = started()
    for i in range(3):
        log.job(job(i))
    assert [e.seq for e in (await log.page(since=1)).events] == [2, 3]
    ahead = await log.page(since=10_000)  # from before a restart: numbers started again
    assert ahead.reset and ahead.next_since == 3


@pytest.mark.parametrize("bad", ["nocolon", ":3", "abc:", "abc:x", "abc:-1"])
async def test_a_malformed_cursor_is_refused_naming_the_field(bad: str) -> None:
    log, _ = started()
    with pytest.raises(InvalidInput) as info:
        await log.page(cursor=bad)
    assert info.value.details["field"] == "cursor"


async def test_the_long_poll_gives_up_when_the_clock_passes_the_wait() -> None:
    log, clock = started()
    poll = asyncio.ensure_future(log.page(cursor=log.cursor(), wait=30))
    await clock.advance(29)
    assert not poll.done()
    await clock.advance(1)
    page = await poll
    assert page.events == [] and not page.reset


async def test_the_long_poll_wakes_on_the_next_event() -> None:
    log, clock = started()
    poll = asyncio.ensure_future(log.page(cursor=log.cursor(), wait=30))
    await clock.advance(1)
    log.job(job(1))
    assert [e.seq for e in (await poll).events] == [1]


async def test_a_closed_log_answers_at_once() -> None:
    log, clock = started()
    poll = asyncio.ensure_future(log.page(cursor=log.cursor(), wait=30))
    await clock.advance(1)  # the poll is parked
    log.close()
    assert (await poll).events == []
