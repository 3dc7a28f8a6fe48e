"""The state directory's lock: a second process waits for an owner that serves a moment late."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpulayer_kernel.home import SERVING_SOON, Layout, StateLock, live_owner


def test_a_second_process_waits_for_the_address_announced(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    lock = StateLock(layout)
    lock.acquire()
    try:
        lock.publish({"serve": SERVING_SOON})
        later = threading.Timer(0.2, lock.publish, [{"url": "http://127.0.0.1:1", "token": "t"}])
        later.start()
        start = time.monotonic()
        owner = live_owner(layout)
        assert owner["url"] == "http://127.0.0.1:1" and time.monotonic() - start >= 0.15
        later.join()
    finally:
        lock.release()
    assert live_owner(layout) == {}  # released: nobody owns it


def test_an_address_that_never_comes_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    lock = StateLock(layout)
    lock.acquire()
    try:
        lock.publish({"serve": SERVING_SOON})
        start = time.monotonic()
        owner = live_owner(layout, wait=0.3)
        assert owner["serve"] == SERVING_SOON and "url" not in owner
        assert 0.25 <= time.monotonic() - start < 5
        lock.publish({})  # an owner that serves nothing is reported at once
        start = time.monotonic()
        assert "pid" in live_owner(layout) and time.monotonic() - start < 0.25
    finally:
        lock.release()
