"""Writes kept while the store is away, and the one loop that writes them once it answers.

The job table keeps the job changes it could not store (*dirty*), the log tails the lines
(ADR 0008). Each hands its kept writes to a :class:`WhenBack`: one task at a time tries them
again with a backoff (0.2 s, doubling to 10 s, on the control plane's clock) until none is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..clock import Clock
from ..errors import Unavailable

log = logging.getLogger("gpulayer.controlplane")


class WhenBack:
    """Writes ``write()`` again while ``pending()``, one loop at a time (``kick``)."""

    def __init__(
        self,
        pending: Callable[[], bool],
        write: Callable[[], Awaitable[None]],
        clock: Clock,
        what: str,
    ) -> None:
        self.pending = pending
        self.write = write
        self.clock = clock
        self.what = what  # for the log: "staged job change", "log line"
        self._task: asyncio.Task[None] | None = None

    def kick(self) -> None:
        """Something was kept: make sure a loop runs."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        attempt = 0
        while self.pending():
            await self.clock.sleep(min(10.0, 0.2 * 2**attempt))  # retry backoff
            attempt += 1
            try:
                await self.write()
            except Unavailable:
                continue
            except Exception:  # pragma: no cover - logged, retried
                log.exception("writing each kept %s after the store came back failed", self.what)
        log.info("the store answers again: every kept %s is written", self.what)
