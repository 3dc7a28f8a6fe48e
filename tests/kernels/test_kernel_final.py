"""A GPU kernel whose session ends on purpose stays ended (issue 33, item 1).

Jupyter's own restarter watches the kernel (``AsyncIOLoopKernelManager``, as jupyter_server runs
it). Before the fix, an idle end made the kernel dead: the restarter started a new session,
which took the GPU again, for ever. Now the kernel stays "alive" for Jupyter, each cell is
answered with the reason and how to get a GPU again, and the user's restart is the reconnect.
A stop from elsewhere (the panel, the CLI) is final the same way; a lost worker is not (tested
in ``test_kernel_failures.py``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from jupyter_client.ioloop.manager import AsyncIOLoopKernelManager

from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.kernels import spec
from gpulayer_kernel.testing import until

from .conftest import Plane, restarter_rounds
from .test_kernel_e2e import free_gpus, run, texts

pytestmark = pytest.mark.slow

IDLE = 3.0  # the spec's idle timeout, seconds


async def start_watched(name: str) -> tuple[AsyncIOLoopKernelManager, Any]:
    """A kernel with jupyter_client's restarter running, as in a Jupyter server."""
    km = AsyncIOLoopKernelManager(kernel_name=name)
    await km.start_kernel()
    assert km._restarter is not None  # started by start_kernel, as jupyter_server has it
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


def sessions(plane: Plane) -> list[Any]:
    return list(plane.call(plane.cp.list_sessions(include_ended=True)))


async def ended(plane: Plane, session_id: str, timeout: float = 30.0) -> Any:
    def info() -> Any:
        return plane.call(plane.cp.get_session(session_id))

    await until(lambda: info().job.state.terminal, timeout, what=f"session {session_id} to end")
    return info()


async def test_an_idle_end_is_final_the_next_cell_says_why_and_a_restart_reconnects(
    gl_plane: Plane,
) -> None:
    spec.install(gpus=1, gpu_kind=[], user=True, wait=20, idle_timeout=IDLE, name="gl-idle")
    km, kc = await start_watched("gl-idle")
    try:
        (first,) = sessions(gl_plane)
        reply, _ = await run(kc, "x = 41")
        assert reply["content"]["status"] == "ok"
        info = await ended(gl_plane, first.id, timeout=IDLE + 20)
        assert info.job.state == JobState.CANCELLED
        assert "idle for" in (info.job.reason or "")
        assert free_gpus(gl_plane) == 2  # the GPU is free ...
        # ... and stays free: the restarter (every 3 s) sees a live kernel, starts nothing.
        await restarter_rounds(km, 2)
        assert [s.id for s in sessions(gl_plane)] == [first.id]
        assert free_gpus(gl_plane) == 2
        assert await km.is_alive()

        reply, out = await run(kc, "x")
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KernelEnded"
        why = reply["content"]["evalue"]
        assert why.startswith("this GPU kernel's session ended: idle for"), why
        assert "restart the kernel (Kernel ▸ Restart) to get a GPU again" in why
        errors = [m["content"]["evalue"] for m in out if m["msg_type"] == "error"]
        assert errors == [why]  # shown in the cell's output, not only in the reply
        # Still nothing started behind the user's back.
        assert len(sessions(gl_plane)) == 1

        # The user's restart is the reconnect: a new session, a GPU again, a fresh kernel.
        await km.restart_kernel()
        await kc.wait_for_ready(timeout=60)
        reply, out = await run(kc, "print(1 + 1)")
        assert reply["content"]["status"] == "ok"
        assert texts(out).strip() == "2"
        now = {s.id: s.job.state for s in sessions(gl_plane)}
        assert len(now) == 2 and now[first.id] == JobState.CANCELLED
        assert sorted(now.values()) == sorted([JobState.CANCELLED, JobState.RUNNING])
        assert free_gpus(gl_plane) == 1
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
    assert free_gpus(gl_plane) == 2


async def test_a_stop_from_elsewhere_is_final_and_the_ended_kernel_still_answers(
    gl_plane: Plane,
) -> None:
    km, kc = await start_watched("gpulayer-1gpu")
    try:
        (kernel,) = sessions(gl_plane)
        gl_plane.call(gl_plane.cp.stop_session(kernel.id, "stopped from the GPUlayer panel"))
        await ended(gl_plane, kernel.id)
        reply, _ = await run(kc, "1 + 1")
        why = reply["content"]["evalue"]
        assert why == (
            "this GPU kernel's session ended: stopped from the GPUlayer panel; "
            "restart the kernel (Kernel ▸ Restart) to get a GPU again"
        )
        # A notebook that connects now (a tab opened later) reads why in the kernel's info.
        kc.kernel_info()
        info = await kc.get_shell_msg(timeout=30)
        while info["msg_type"] != "kernel_info_reply":
            info = await kc.get_shell_msg(timeout=30)
        assert info["content"]["status"] == "ok"
        assert info["content"]["banner"] == why
        # Completion and the like get an error reply, not silence.
        kc.complete("imp", 3)
        done = await kc.get_shell_msg(timeout=30)
        assert done["msg_type"] == "complete_reply"
        assert done["content"]["status"] == "error"
        await restarter_rounds(km, 1)
        assert len(sessions(gl_plane)) == 1
    finally:
        kc.stop_channels()
        began = time.monotonic()
        await km.shutdown_kernel()
    # The relay answers the shutdown request: no wait for a kill (10 s) on an ended kernel.
    assert time.monotonic() - began < 5.0
    assert len(sessions(gl_plane)) == 1


async def test_a_normal_shutdown_reads_as_stopped_by_the_user(gl_plane: Plane) -> None:
    km, kc = await start_watched("gpulayer-1gpu")
    (kernel,) = sessions(gl_plane)
    kc.stop_channels()
    await km.shutdown_kernel()
    info = await ended(gl_plane, kernel.id)
    assert info.job.state == JobState.CANCELLED
    assert info.job.reason == "session stopped by the user (its kernel was shut down in Jupyter)"
