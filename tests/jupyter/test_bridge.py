"""The kernel's bridge: opening, failing clearly, and opening again once the cause is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer_kernel.errors import Unavailable
from gpulayer_kernel.home import Layout, StateLock
from gpulayer_kernel.jupyter import bridge as bridge_mod
from gpulayer_kernel.jupyter.bridge import Bridge, Target


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
