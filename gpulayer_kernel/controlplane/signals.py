"""Wake-ups without polling (ADR 0016): waiters park on a future that the next change resolves."""

from __future__ import annotations

import asyncio
import contextlib

from ..clock import SYSTEM_CLOCK, Clock


class Signal:
    """A broadcast edge: ``fire()`` wakes every current waiter at once.

    Use as: check your condition; if unmet, ``await signal.wait(timeout)``; check again. Between the
    check and the wait there is no ``await``, so no change can slip by on a single event loop.
    Timeouts run on ``clock``, so a test's FakeClock decides when a long-poll gives up.

    Each waiter parks on a future of its own that ``fire()`` resolves itself: the waiting task
    runs in the loop's next turn. (Parking on one shared future, which a waiter must not cancel,
    took a private future behind it, woken by a callback: a turn more on every wake-up, and
    every long-poll's answer waits on one.)
    """

    __slots__ = ("_clock", "_waiters")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._waiters: list[asyncio.Future[bool]] = []

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    @property
    def waiting(self) -> int:
        """How many waiters the next ``fire()`` wakes."""
        return len(self._waiters)

    async def wait(self, timeout: float | None) -> bool:
        """Wait for the next ``fire()``; False when ``timeout`` seconds passed first."""
        if timeout is not None and timeout <= 0:
            return False
        return await _park(self._clock, timeout, (self,))


async def first_of(clock: Clock, timeout: float | None, *signals: Signal) -> bool:
    """Wait for the next fire of any of ``signals``; False when ``timeout`` passed first. The
    waiter is registered before the first await, so a fire between a check and this wait counts;
    one future, no task (this is on every stream's path)."""
    if timeout is not None and timeout <= 0:
        return False
    return await _park(clock, timeout, signals)


async def _park(clock: Clock, timeout: float | None, signals: tuple[Signal, ...]) -> bool:
    """One waiter on each of ``signals`` (registered now, before any await); True when one fired,
    False when ``timeout`` passed first."""
    waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    for sig in signals:
        sig._waiters.append(waiter)

    def expire() -> None:
        if not waiter.done():
            waiter.set_result(False)

    timer = None if timeout is None else clock.call_later(timeout, expire)
    try:
        return await waiter
    finally:
        if timer is not None:
            timer.cancel()
        for sig in signals:
            # A fire took it off already; a timeout or a cancel leaves it to take off here.
            with contextlib.suppress(ValueError):
                sig._waiters.remove(waiter)


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
