"""The reaper on its own: it looks every quarter heartbeat period of the clock, and survives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import WorkerRegistration
from gpulayer_kernel.controlplane.events import EventLog
from gpulayer_kernel.controlplane.reaper import Reaper
from gpulayer_kernel.controlplane.workers import WorkerRegistry
from gpulayer_kernel.store import SqliteStore
from gpulayer_kernel.testing import FakeClock


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[WorkerRegistry]:
    store = SqliteStore(tmp_path / "r.db")
    await store.open()
    yield WorkerRegistry(store, EventLog(), list, clock=FakeClock(), heartbeat_timeout=8.0)
    await store.close()


async def test_overdue_workers_are_handed_over_and_a_failed_round_is_not_the_last(
    registry: WorkerRegistry,
) -> None:
    clock = registry.clock
    assert isinstance(clock, FakeClock)
    wid = (await registry.register(WorkerRegistration(name="w1"))).id
    lost: list[tuple[str, str]] = []
    rounds: list[float] = []

    async def lose(worker_id: str, why: str) -> None:
        lost.append((worker_id, why))
        if len(lost) == 1:
            raise RuntimeError("the store is away")
        registry.mark_gone(worker_id)

    async def rendezvous() -> None:
        rounds.append(clock.monotonic())

    reaper = Reaper(registry, lose, rendezvous, clock=clock)
    assert reaper.period == 2.0
    reaper.start()
    try:
        await clock.advance(8)
        assert rounds == [2.0, 4.0, 6.0, 8.0] and lost == []
        await clock.advance(2)  # overdue: handed over, and the first attempt fails
        assert lost == [(wid, "no heartbeat for 10.0s")]
        await clock.advance(2)  # the next round tries again
        w = registry.get(wid)
        assert [x for x, _ in lost] == [wid, wid] and w is not None and not w.live
    finally:
        await reaper.stop()
    assert clock.pending == 0
