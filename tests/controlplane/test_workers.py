"""The worker registry on its own: enrolment, heartbeats on a fake clock, usage, loss, removal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    Job,
    JobSpec,
    JobState,
    NodePlacement,
    Placement,
    WorkerRegistration,
    WorkerState,
)
from gpulayer_kernel.contracts.jobs import CommandWorkload
from gpulayer_kernel.controlplane.events import EventLog
from gpulayer_kernel.controlplane.workers import WorkerRegistry
from gpulayer_kernel.errors import Conflict, InvalidInput, NotFound
from gpulayer_kernel.store import SqliteStore
from gpulayer_kernel.testing import FakeClock


class Registry:
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.clock = FakeClock()
        self.events = EventLog(self.clock)
        self.jobs: list[Job] = []
        self.reg = WorkerRegistry(
            store, self.events, lambda: self.jobs, clock=self.clock, heartbeat_timeout=10.0
        )

    async def join(self, name: str = "w1", **kw: object) -> str:
        info = await self.reg.register(WorkerRegistration(name=name, **kw))  # type: ignore[arg-type]
        return info.id


@pytest.fixture
async def r(tmp_path: Path) -> AsyncIterator[Registry]:
    store = SqliteStore(tmp_path / "workers.db")
    await store.open()
    yield Registry(store)
    await store.close()


async def test_a_worker_joins_ready_and_is_written_and_announced(r: Registry) -> None:
    wid = await r.join()
    w = r.reg.require(wid)
    assert (w.state, w.live, w.last_heartbeat) == (WorkerState.READY, True, r.clock.now())
    assert [x.id for x in await r.store.load_workers()] == [wid]
    assert [e.worker.id for e in (await r.events.page()).events if e.worker] == [wid]


async def test_a_silent_worker_becomes_overdue_on_the_clock(r: Registry) -> None:
    wid = await r.join()
    await r.clock.advance(10)
    assert r.reg.overdue(r.clock.now()) == []
    await r.clock.advance(0.5)
    r.reg.heartbeat(wid)
    await r.clock.advance(10)
    assert r.reg.overdue(r.clock.now()) == []
    await r.clock.advance(0.5)
    assert [w.id for w in r.reg.overdue(r.clock.now())] == [wid]


async def test_usage_is_counted_from_placed_and_running_jobs(r: Registry) -> None:
    wid = await r.join()
    spec = JobSpec(workload=CommandWorkload(argv=["true"]))
    node = NodePlacement(worker_id=wid, worker_name="w1", devices=[0, 1])
    r.jobs = [
        Job(id="a" * 12, seq=1, spec=spec, submitted_at=0, state=JobState.RUNNING,
            placement=Placement(nodes=[node])),
        Job(id="b" * 12, seq=2, spec=spec, submitted_at=0),
    ]  # fmt: skip
    r.reg.refresh(wid)
    w = r.reg.require(wid)
    assert (w.state, w.running, w.device_jobs) == (
        WorkerState.BUSY,
        ["a" * 12],
        {0: "a" * 12, 1: "a" * 12},
    )
    r.jobs = []
    r.reg.refresh(wid)
    assert r.reg.require(wid).state == WorkerState.READY


async def test_cordon_and_drain_survive_a_rejoin(r: Registry) -> None:
    wid = await r.join()
    await r.reg.set_state(wid, WorkerState.DRAINING)
    again = await r.reg.register(WorkerRegistration(name="w1"), wid)
    assert again.state == WorkerState.DRAINING
    with pytest.raises(InvalidInput):
        await r.reg.set_state(wid, WorkerState.LOST)


async def test_a_lost_worker_is_out_of_service_and_can_be_removed(r: Registry) -> None:
    wid = await r.join()
    with pytest.raises(Conflict):
        await r.reg.remove(wid)  # still in service
    gone = r.reg.mark_gone(wid)
    assert (gone.state, gone.live) == (WorkerState.LOST, False)
    assert r.reg.live() == [] and r.reg.overdue(r.clock.now() + 100) == []
    with pytest.raises(NotFound):
        r.reg.heartbeat(wid)
    await r.reg.save(wid)
    assert await r.reg.remove(wid) and r.reg.get(wid) is None and not await r.reg.remove(wid)
    assert await r.store.load_workers() == []  # removed for good, across restarts


async def test_restore_hands_back_in_process_workers_and_gives_remote_ones_time(
    r: Registry,
) -> None:
    local = await r.join("local")
    remote = await r.join("remote", transport="http")
    gone = await r.join("gone")
    await r.reg.save(r.reg.mark_gone(gone, WorkerState.OFFLINE).id)
    await r.clock.advance(100)
    again = WorkerRegistry(r.store, r.events, list, clock=r.clock, heartbeat_timeout=10.0)
    dead = again.restore(await r.store.load_workers())
    assert [w.id for w in dead] == [local]
    assert again.get(gone) is None
    w = again.get(remote)
    assert w is not None and w.last_heartbeat == r.clock.now()
