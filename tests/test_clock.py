"""The one clock: FakeClock moves only when told, in order; SystemClock is the real thing."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpulayer_kernel.clock import SYSTEM_CLOCK
from gpulayer_kernel.controlplane.signals import Signal
from gpulayer_kernel.testing import FakeClock, until, wait_until


async def test_fake_clock_fires_timers_in_time_order_and_only_when_advanced() -> None:
    clock = FakeClock(start=1000.0)
    fired: list[str] = []
    clock.call_later(5, lambda: fired.append("b"))
    clock.call_later(1, lambda: fired.append("a"))
    cancelled = clock.call_later(3, lambda: fired.append("never"))
    cancelled.cancel()
    assert clock.pending == 2 and clock.next_deadline() == 1
    await clock.advance(0.5)
    assert fired == []
    await clock.advance(4.5)
    assert fired == ["a", "b"]
    assert clock.monotonic() == 5 and clock.now() == 1005.0
    with pytest.raises(ValueError, match="backwards"):
        await clock.advance(-1)


async def test_fake_sleep_wakes_at_its_time_and_sees_the_time_of_its_timer() -> None:
    clock = FakeClock()
    woke: list[float] = []

    async def sleeper(s: float) -> None:
        await clock.sleep(s)
        woke.append(clock.monotonic())

    tasks = [asyncio.create_task(sleeper(s)) for s in (30, 10, 20)]
    await clock.advance(25)
    assert woke == [10, 20]
    await clock.advance(100)
    assert woke == [10, 20, 30]
    await asyncio.gather(*tasks)


async def test_signal_wait_times_out_on_the_fake_clock_and_wakes_on_fire() -> None:
    clock = FakeClock()
    sig = Signal(clock)
    waiter = asyncio.create_task(sig.wait(60))
    await clock.advance(59)
    assert not waiter.done()
    await clock.advance(1)
    assert await waiter is False
    waiter = asyncio.create_task(sig.wait(60))
    await asyncio.sleep(0)
    sig.fire()
    assert await waiter is True
    assert clock.pending == 0  # the timeout's timer is gone with its wait


async def test_a_cancelled_waiter_does_not_cancel_the_others() -> None:
    for clock in (FakeClock(), SYSTEM_CLOCK):
        sig = Signal(clock)
        first = asyncio.create_task(sig.wait(30))
        second = asyncio.create_task(sig.wait(30))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        assert sig.waiting == 1  # the cancelled one left
        sig.fire()
        assert await second is True


async def test_a_fire_wakes_its_waiters_in_the_next_turn_of_the_loop() -> None:
    # On every long-poll's answer: the waiting task runs in the turn after the fire, not two.
    for clock in (FakeClock(), SYSTEM_CLOCK):
        sig = Signal(clock)
        waiters = [asyncio.create_task(sig.wait(t)) for t in (30, None)]
        await asyncio.sleep(0)
        assert sig.waiting == 2
        sig.fire()
        await asyncio.sleep(0)
        assert all(w.done() for w in waiters) and [w.result() for w in waiters] == [True, True]
        assert sig.waiting == 0


async def test_waiters_that_time_out_leave_nothing_behind() -> None:
    clock = FakeClock()
    sig = Signal(clock)
    for _ in range(3):
        waiters = [asyncio.create_task(sig.wait(5)) for _ in range(100)]
        await clock.advance(5)
        assert [await w for w in waiters] == [False] * 100
    assert sig.waiting == 0 and clock.pending == 0  # a long-lived key's list does not grow


async def test_system_clock_waits_for_real() -> None:
    loop_fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    t0 = time.monotonic()
    assert await SYSTEM_CLOCK.wait_for(loop_fut, 0.05) is False
    assert time.monotonic() - t0 >= 0.04
    assert await SYSTEM_CLOCK.wait_for(loop_fut, 0) is False
    SYSTEM_CLOCK.call_later(0.01, lambda: loop_fut.set_result(None))
    assert await SYSTEM_CLOCK.wait_for(loop_fut, 5) is True


def test_wait_until_returns_at_once_or_names_what_it_waited_for() -> None:
    wait_until(lambda: True, 0.1)
    with pytest.raises(TimeoutError, match="the moon"):
        wait_until(lambda: False, 0.05, what="the moon")


async def test_until_accepts_coroutine_predicates() -> None:
    calls = 0

    async def ready() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3

    await until(ready, 1)
    assert calls == 3
    with pytest.raises(TimeoutError):
        await until(lambda: False, 0.05)
