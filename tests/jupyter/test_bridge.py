"""The kernel's bridge: opening, failing clearly, and opening again once the cause is gone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path

import pytest

from gpulayer_kernel.errors import NotFound, Unavailable
from gpulayer_kernel.home import Layout, StateLock
from gpulayer_kernel.jupyter import bridge as bridge_mod
from gpulayer_kernel.jupyter.bridge import Bridge, Target
from gpulayer_kernel.testing import wait_until


def test_a_locked_home_is_reported_and_retried(gl_home: Path) -> None:
    gl_home.mkdir(parents=True)
    other_owner = StateLock(Layout(gl_home))
    other_owner.acquire()  # another control plane owns this folder
    try:
        b = bridge_mod.reconnect(Target(local=True))
        with pytest.raises(Unavailable) as err:
            b.workers()
        assert err.value.code == "home_locked"
        assert "GPULAYER_HOME" in err.value.hint
        assert b.failed
    finally:
        other_owner.release()
    try:
        again = bridge_mod.get_bridge()  # the failed bridge is replaced, same target
        assert again is not b and again.target == b.target
        assert len(again.workers()) == 1
        assert again.embedded and "embedded control plane in" in again.describe()
    finally:
        bridge_mod.close_bridge()


def test_closed_bridge_refuses_calls(gl_home: Path) -> None:
    b = Bridge(Target(local=True))
    b.ready()
    b.close()
    with pytest.raises(Unavailable, match="closed"):
        b.workers()


def test_a_call_returns_its_value_raises_its_error_and_a_timed_out_one_is_cancelled(
    gl_home: Path,
) -> None:
    b = Bridge(Target(local=True))
    try:
        b.ready()
        assert b.call(lambda s: _value(41)) == 42
        with pytest.raises(NotFound, match="no such thing") as err:
            b.call(lambda s: _raise(NotFound("no such thing", code="job_not_found")))
        assert err.value.code == "job_not_found"  # the very error, not a wrapper

        ended: list[str] = []  # what the call's coroutine saw, on the loop
        started = threading.Event()

        async def slow(s: object) -> None:
            started.set()
            try:
                await asyncio.sleep(60)
                ended.append("finished")
            except asyncio.CancelledError:
                ended.append("cancelled")
                raise

        with pytest.raises(concurrent.futures.TimeoutError):
            b.call(slow, timeout=0.2)
        assert started.is_set()
        wait_until(lambda: ended == ["cancelled"], 10, what="the call to be cancelled on the loop")
        assert b.call(lambda s: _value(1)) == 2  # the bridge serves the next call
    finally:
        b.close()


async def _value(n: int) -> int:
    return n + 1


async def _raise(exc: Exception) -> None:
    raise exc
