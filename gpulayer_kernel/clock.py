"""One clock for everything that waits or times out: the control plane, workers, long-polls.

Every part that reads the time, sleeps, or arms a timer takes a :class:`Clock` instead of calling
``time``/``asyncio`` directly, so a test can hand it :class:`gpulayer_kernel.testing.FakeClock` and
drive heartbeat loss, reservations, idle timeouts and retry backoff by hand, waiting no real
seconds. Production code uses :data:`SYSTEM_CLOCK`.

- ``now()``: wall-clock seconds since the epoch, for records people read (``submitted_at``,
  ``last_heartbeat``) and for ages compared across restarts.
- ``monotonic()``: seconds for deadlines inside one process.
- ``sleep(s)``, ``call_later(s, fn)``: waiting, on the monotonic scale.
- ``wait_for(fut, timeout)``: wait for a future at most ``timeout`` seconds of this clock; the one
  primitive long-polls need (``Signal.wait``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    """A scheduled callback that can be called off."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time as the rest of GPUlayer sees it."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer: ...

    async def wait_for(self, fut: asyncio.Future[Any], timeout: float | None) -> bool:
        """Wait for ``fut`` (never cancelling it); False when ``timeout`` ran out first."""
        ...


class SystemClock:
    """The real clock: ``time`` and the running asyncio loop."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)

    async def wait_for(self, fut: asyncio.Future[Any], timeout: float | None) -> bool:
        if fut.done():
            return True
        if timeout is not None and timeout <= 0:
            return False
        # A private waiter, woken by ``fut`` or the timer: ``fut`` (which others may share) is
        # never cancelled, and no task is made (asyncio.wait_for + shield cost ~3 of them per
        # call, on every long-poll's hot path).
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()

        def settle(_: object = None, result: bool = True) -> None:
            if not waiter.done():
                waiter.set_result(result)

        fut.add_done_callback(settle)
        timer = None if timeout is None else loop.call_later(timeout, settle, None, False)
        try:
            return await waiter
        finally:
            fut.remove_done_callback(settle)
            if timer is not None:
                timer.cancel()


SYSTEM_CLOCK: Clock = SystemClock()
