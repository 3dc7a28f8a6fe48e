"""The job table on its own: every change checked against the tables, one commit path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import JobSpec, JobState, NodePlacement, Placement
from gpulayer_kernel.contracts.jobs import CommandWorkload
from gpulayer_kernel.controlplane.events import EventLog
from gpulayer_kernel.controlplane.jobs import FINISHED_CACHE, Change, JobTable
from gpulayer_kernel.errors import Conflict
from gpulayer_kernel.store import SqliteStore
from gpulayer_kernel.testing import FakeClock

SPEC = JobSpec(workload=CommandWorkload(argv=["true"]))
ON_W1 = Placement(nodes=[NodePlacement(worker_id="w1", worker_name="w1")])


class Table:
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.clock = FakeClock()
        self.events = EventLog(self.clock)
        self.changes: list[Change] = []
        self.jobs = JobTable(store, self.events, clock=self.clock, on_change=self.changes.append)

    async def new(self) -> str:
        change = self.jobs.add(SPEC)
        await self.jobs.flush([change])
        return change.after.id

    async def states(self) -> list[str]:
        page = await self.events.page()
        return [e.job.state.value for e in page.events if e.job is not None]


@pytest.fixture
async def table(tmp_path: Path) -> AsyncIterator[Table]:
    store = SqliteStore(tmp_path / "jobs.db")
    await store.open()
    yield Table(store)
    await store.close()


async def test_a_new_job_is_numbered_written_and_announced(table: Table) -> None:
    a, b = await table.new(), await table.new()
    assert [table.jobs.active_job(i).seq for i in (a, b)] == [1, 2]  # type: ignore[union-attr]
    assert (await table.store.get_job(a)) is not None
    assert await table.states() == ["queued", "queued"]


async def test_a_move_is_checked_stamped_written_and_announced(table: Table) -> None:
    job_id = await table.new()
    await table.jobs.commit(job_id, JobState.PLACED, placement=ON_W1, placed_at=1.0)
    await table.jobs.commit(job_id, JobState.RUNNING)
    with pytest.raises(Conflict) as info:
        await table.jobs.commit(job_id, JobState.PLACED)
    assert info.value.code == "illegal_transition"
    done = await table.jobs.commit(job_id, JobState.SUCCEEDED)
    assert done.finished_at == table.clock.now()
    stored = await table.store.get_job(job_id)
    assert stored is not None and stored.state == JobState.SUCCEEDED
    assert await table.states() == ["queued", "placed", "running", "succeeded"]
    assert [(c.before.state.value, c.after.state.value) for c in table.changes[1:]] == [
        ("queued", "placed"),
        ("placed", "running"),
        ("running", "succeeded"),
    ]


async def test_a_field_changes_only_where_the_table_allows_it(table: Table) -> None:
    job_id = await table.new()
    with pytest.raises(Conflict) as info:
        await table.jobs.commit(job_id, cancel_requested=True)  # queued: cancel, don't flag
    assert info.value.code == "illegal_update"
    with pytest.raises(Conflict):
        await table.jobs.note(job_id, progress={"step": 1})
    await table.jobs.commit(job_id, JobState.PLACED, placement=ON_W1)
    job = await table.jobs.commit(job_id, cancel_requested=True, reason="stop")
    assert job.cancel_requested and job.state == JobState.PLACED
    with pytest.raises(Conflict):
        await table.jobs.commit(job_id, attempts=5)  # only a retry (a move) counts attempts


async def test_a_final_job_never_changes_again(table: Table) -> None:
    job_id = await table.new()
    await table.jobs.commit(job_id, JobState.CANCELLED, reason="no")
    with pytest.raises(Conflict) as info:
        await table.jobs.commit(job_id, JobState.QUEUED)
    assert info.value.code == "illegal_transition"
    with pytest.raises(Conflict) as info:
        await table.jobs.commit(job_id, reason="changed")
    assert "cancelled" in info.value.message


async def test_notes_stay_in_memory_and_unchanged_reasons_are_quiet(table: Table) -> None:
    job_id = await table.new()
    await table.jobs.commit(job_id, JobState.PLACED, placement=ON_W1)
    await table.jobs.note(job_id, progress={"step": 3})
    assert table.jobs.active_job(job_id).progress == {"step": 3}  # type: ignore[union-attr]
    stored = await table.store.get_job(job_id)
    assert stored is not None and stored.progress is None
    before = table.events.seq
    await table.jobs.note(job_id, announce=False, progress={"step": 4})
    assert table.events.seq == before


async def test_a_flush_writes_the_job_as_it_is_now(table: Table) -> None:
    job_id = await table.new()
    placed = table.jobs.stage(job_id, JobState.PLACED, placement=ON_W1)
    await table.jobs.commit(job_id, cancel_requested=True, reason="stop")
    await table.jobs.flush([placed])  # staged earlier, flushed later: no older copy wins
    stored = await table.store.get_job(job_id)
    assert stored is not None and stored.cancel_requested


async def test_finished_jobs_are_cached_then_read_from_the_store(table: Table) -> None:
    first = await table.new()
    await table.jobs.commit(first, JobState.CANCELLED)
    assert table.jobs.cached(first) is not None and table.jobs.active_job(first) is None
    for _ in range(FINISHED_CACHE):
        await table.jobs.commit(await table.new(), JobState.CANCELLED)
    assert table.jobs.cached(first) is None
    assert (await table.jobs.get(first[:6])).state == JobState.CANCELLED


async def test_wait_returns_at_the_end_or_when_the_clock_passes_the_timeout(table: Table) -> None:
    job_id = await table.new()
    waiting = asyncio.ensure_future(table.jobs.wait(job_id, timeout=60))
    await table.clock.advance(59)
    assert not waiting.done()
    await table.clock.advance(1)
    assert (await waiting).state == JobState.QUEUED
    ending = asyncio.ensure_future(table.jobs.wait(job_id))
    await table.clock.advance(0)
    await table.jobs.commit(job_id, JobState.CANCELLED)
    assert (await ending).state == JobState.CANCELLED


async def test_gang_nodes_are_counted_until_the_job_moves_on(table: Table) -> None:
    job_id = await table.new()
    await table.jobs.commit(job_id, JobState.PLACED, placement=ON_W1)
    assert table.jobs.node_done(job_id, "w1") == 1
    assert table.jobs.node_done(job_id, "w1") == 1
    assert table.jobs.node_done(job_id, "w2") == 2
    await table.jobs.commit(job_id, JobState.QUEUED, placement=None)
    assert table.jobs.node_done(job_id, "w1") == 1


async def test_load_takes_back_active_jobs_and_numbering(table: Table) -> None:
    a = await table.new()
    b = await table.new()
    await table.jobs.commit(b, JobState.CANCELLED)
    again = JobTable(table.store, EventLog(table.clock), clock=table.clock)
    await again.load()
    assert [j.id for j in again.active()] == [a] and again.seq == 2
    with pytest.raises(Conflict) as info:
        again.held_by(a, "w1")  # queued: no worker holds it
    assert info.value.code == "not_assigned"
