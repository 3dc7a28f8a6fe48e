"""Stopping: an idle ``gpulayer worker`` whose server is gone exits within 5 s of SIGTERM.

It used to spend 15-35 s saying goodbye (its leave request rode out a failover window against
a server that would never answer).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from gpulayer_kernel.testing.processes import ServeProcess, WorkerProcess

EXIT_WITHIN = 5.0


@pytest.mark.slow
@pytest.mark.parametrize("gone", ["killed", "frozen"])
def test_an_idle_worker_exits_quickly_on_sigterm_when_its_server_is_gone(
    tmp_path: Path, gone: str
) -> None:
    """Killed: connections are refused at once. Frozen (SIGSTOP, like a hung host or a network
    that drops packets): the kernel still accepts them, and no answer ever comes."""
    with ServeProcess(tmp_path / "cp") as server:
        join = server.create_token("join")
        worker = WorkerProcess(server.url, join, name="idle", home=tmp_path / "w").start()
        try:
            server.kill(signal.SIGKILL if gone == "killed" else signal.SIGSTOP)
            time.sleep(1.0)  # the worker's poll is failing, or hanging, by now
            assert worker.alive()
            assert worker.proc is not None
            started = time.monotonic()
            worker.kill(signal.SIGTERM)
            worker.proc.wait(timeout=30)
            took = time.monotonic() - started
            print(f"{gone}: exited {took:.2f}s after SIGTERM")
        finally:
            worker.stop()
            server.kill(signal.SIGCONT)  # a frozen server must be able to hear its SIGTERM
    assert worker.proc.returncode == 0, worker.output()[-2000:]
    assert took < EXIT_WITHIN, f"took {took:.1f}s to exit:\n{worker.output()[-2000:]}"
    assert "left the control plane" in worker.output()
