"""Wait for a condition with a deadline: the replacement for fixed sleeps in tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

POLL = 0.01


def wait_until(
    predicate: Callable[[], object], timeout: float = 10.0, *, what: str | None = None
) -> None:
    """Return as soon as ``predicate()`` is true; raise ``TimeoutError`` after ``timeout`` s.

    Real time on purpose: it waits for other processes and threads, which no fake clock moves.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what or predicate}")
        time.sleep(POLL)


async def until(
    predicate: Callable[[], object | Awaitable[object]],
    timeout: float = 10.0,
    *,
    what: str | None = None,
) -> None:
    """The async twin of :func:`wait_until`; ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what or predicate}")
        await asyncio.sleep(POLL)
