"""FakeClock: a Clock that moves only when a test says so (``await clock.advance(30)``).

Timers and sleepers fire in time order as the clock passes them, each followed by a few turns of
the event loop so that the tasks they wake run before the next one fires. Work that leaves the
loop (a store write's thread hop, another process) is not waited for: follow ``advance`` with
:func:`gpulayer_kernel.testing.until` when a test needs its effect.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

SETTLE_TURNS = 20  # loop turns after each fired timer: enough for a chain of awaits to run


class FakeTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A :class:`gpulayer_kernel.clock.Clock` at ``start`` (wall) and 0 (monotonic) until moved."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall0 = start
        self._mono = 0.0
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._wall0 + self._mono

    def monotonic(self) -> float:
        return self._mono

    def call_later(self, delay: float, callback: Callable[[], object]) -> FakeTimer:
        timer = FakeTimer(self._mono + max(0.0, delay), callback)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, lambda: _resolve(fut))
        try:
            await fut
        finally:
            timer.cancel()

    async def wait_for(self, fut: asyncio.Future[Any], timeout: float | None) -> bool:
        if timeout is not None and timeout <= 0:
            return fut.done()
        expired: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = None if timeout is None else self.call_later(timeout, lambda: _resolve(expired))
        try:
            await asyncio.wait({fut, expired}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if timer is not None:
                timer.cancel()
            expired.cancel()
        return fut.done()

    @property
    def pending(self) -> int:
        """How many timers (sleepers included) wait for the clock to reach them."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_deadline(self) -> float | None:
        """When the earliest live timer fires (monotonic), or None."""
        live = [w for w, _, t in self._timers if not t.cancelled]
        return min(live) if live else None

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer it passes, in order."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        target = self._mono + seconds
        await _settle()
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._mono = max(self._mono, when)
            timer.callback()
            await _settle()
        self._mono = target
        await _settle()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
