"""The reaper: notices workers that stopped heartbeating and gangs whose rendezvous never came.

Not a hot path: it wakes every quarter of the heartbeat timeout (between 0.05 and 5 s) on the
control plane's clock, so a test with a FakeClock drives it by advancing time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ..clock import SYSTEM_CLOCK, Clock
from .workers import WorkerRegistry

log = logging.getLogger("gpulayer.controlplane")


class Reaper:
    """A background task: each period, lose overdue workers, then check rendezvous deadlines."""

    def __init__(
        self,
        workers: WorkerRegistry,
        lose: Callable[[str, str], Awaitable[None]],
        rendezvous_overdue: Callable[[], Awaitable[None]],
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.workers = workers
        self.lose = lose
        self.rendezvous_overdue = rendezvous_overdue
        self.clock = clock
        self.period = max(0.05, min(5.0, workers.heartbeat_timeout / 4))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep(self) -> None:
        """One round, as the loop runs it."""
        now = self.clock.now()
        for w in self.workers.overdue(now):
            silent = now - w.last_heartbeat
            log.warning("worker %s lost: no heartbeat for %.1fs", w.name, silent)
            await self.lose(w.id, f"no heartbeat for {silent:.1f}s")
        await self.rendezvous_overdue()

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(self.period)
            try:
                await self.sweep()
            except Exception:
                # One bad round (a store error) must not end the watch for good.
                log.exception("reaper round failed")
