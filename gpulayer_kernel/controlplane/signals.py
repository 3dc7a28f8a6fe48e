"""Wake-ups without polling (ADR 0016): waiters park on a future that the next change resolves."""

from __future__ import annotations

import asyncio

from ..clock import SYSTEM_CLOCK, Clock


class Signal:
    """A broadcast edge: ``fire()`` wakes every current waiter at once.

    Use as: check your condition; if unmet, ``await signal.wait(timeout)``; check again. Between the
    check and the wait there is no ``await``, so no change can slip by on a single event loop.
    Timeouts run on ``clock``, so a test's FakeClock decides when a long-poll gives up.
    """

    __slots__ = ("_clock", "_fut")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._fut: asyncio.Future[None] | None = None

    def fire(self) -> None:
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self, timeout: float | None) -> bool:
        """Wait for the next ``fire()``; False when ``timeout`` seconds passed first."""
        fut = self.armed()
        if timeout is not None and timeout <= 0:
            return False
        return await self._clock.wait_for(fut, timeout)

    def armed(self) -> asyncio.Future[None]:
        """The future the next ``fire()`` resolves, taken now (no await: nothing slips by)."""
        if self._fut is None or self._fut.done():
            self._fut = asyncio.get_running_loop().create_future()
        return self._fut


async def first_of(clock: Clock, timeout: float | None, *signals: Signal) -> bool:
    """Wait for the next fire of any of ``signals``; False when ``timeout`` passed first. The
    futures are taken before the first await, so a fire between a check and this wait counts;
    one private waiter, no task (this is on every stream's path)."""
    futs = [s.armed() for s in signals]
    if any(f.done() for f in futs):
        return True
    if timeout is not None and timeout <= 0:
        return False
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    for f in futs:
        f.add_done_callback(settle)
    try:
        return await clock.wait_for(waiter, timeout)
    finally:
        for f in futs:
            f.remove_done_callback(settle)


class Signals:
    """One :class:`Signal` per key (a job id, a worker id), made on first use, dropped on demand."""

    __slots__ = ("_clock", "_by_key")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._by_key: dict[str, Signal] = {}

    def fire(self, key: str) -> None:
        sig = self._by_key.get(key)
        if sig is not None:
            sig.fire()

    async def wait(self, key: str, timeout: float | None) -> bool:
        """Wait for the next ``fire(key)``; False when ``timeout`` seconds passed first."""
        sig = self._by_key.get(key)
        if sig is None:
            sig = self._by_key[key] = Signal(self._clock)
        return await sig.wait(timeout)

    def drop(self, key: str) -> None:
        """Wake the key's waiters one last time and forget it (late waiters make a new one)."""
        sig = self._by_key.pop(key, None)
        if sig is not None:
            sig.fire()

    def fire_all(self) -> None:
        for sig in self._by_key.values():
            sig.fire()
