"""A GPU kernel driven by jupyter_client as JupyterLab drives it: execute, state, output,
display, ``input()``, comms, interrupt, restart, shutdown (which frees its GPUs)."""

from __future__ import annotations

from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

from gpulayer_kernel.contracts import JobState

from .conftest import Plane

pytestmark = pytest.mark.slow


async def start(name: str = "gpulayer-1gpu") -> tuple[AsyncKernelManager, Any]:
    km = AsyncKernelManager(kernel_name=name)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


async def run(kc: Any, code: str, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    reply = await kc.execute_interactive(code, output_hook=seen.append, timeout=60, **kw)
    return reply, seen


def texts(msgs: list[dict[str, Any]]) -> str:
    return "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream")


def free_gpus(plane: Plane, worker: str = "w1") -> int:
    async def free() -> int:
        info = next(w for w in await plane.cp.workers() if w.name == worker)
        return len(info.capabilities.devices) - len(info.device_jobs)

    return int(plane.call(free()))


async def test_a_gpu_kernel_runs_on_its_worker_keeps_state_and_frees_its_gpus(
    gl_plane: Plane,
) -> None:
    km, kc = await start()
    try:
        sessions = gl_plane.call(gl_plane.cp.list_sessions())
        (kernel,) = sessions
        assert kernel.kernel is True
        assert kernel.job.state == JobState.RUNNING
        assert kernel.job.placement is not None
        assert kernel.job.placement.nodes[0].worker_name == "w1"
        assert len(kernel.job.placement.nodes[0].devices) == 1

        reply, _ = await run(kc, "x = 41")
        assert reply["content"]["status"] == "ok"
        reply, out = await run(kc, "import os\nprint(x + 1, os.environ['GPULAYER_SESSION'])")
        assert texts(out).split() == ["42", kernel.id]  # state kept; it runs as the session

        _, out = await run(
            kc, "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))"
        )
        shown = [m for m in out if m["msg_type"] == "display_data"]
        assert shown[0]["content"]["data"]["text/html"] == "<b>hi</b>"

        # input() goes over the stdin channel and back
        async def answer(msg: dict[str, Any]) -> None:
            assert msg["content"]["prompt"] == "name? "
            kc.input("ada")

        _, out = await run(
            kc, "print('hello', input('name? '))", allow_stdin=True, stdin_hook=answer
        )
        assert "hello ada" in texts(out)

        # a comm opened by the kernel reaches the client; comm_info answers on shell
        _, out = await run(
            kc, "from comm import create_comm\nc = create_comm(target_name='gl', data={'a': 1})"
        )
        opened = [m for m in out if m["msg_type"] == "comm_open"]
        assert opened and opened[0]["content"]["data"] == {"a": 1}
        msg_id = kc.comm_info()
        info = await kc.get_shell_msg(timeout=30)
        assert info["parent_header"]["msg_id"] == msg_id
        assert any(c["target_name"] == "gl" for c in info["content"]["comms"].values())

        # interrupt: KeyboardInterrupt in the running cell, the state stays
        long = kc.execute("import time\nprint('started', flush=True)\ntime.sleep(60)")
        while True:  # the signal goes once the cell runs on the worker
            msg = await kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == long and msg["msg_type"] == "stream":
                assert "started" in msg["content"]["text"]
                break
        await km.interrupt_kernel()
        while True:
            msg = await kc.get_shell_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == long:
                break
        assert msg["content"]["status"] == "error"
        assert msg["content"]["ename"] == "KeyboardInterrupt"
        _, out = await run(kc, "print(x)")
        assert texts(out).strip() == "41"

        # restart: a new process on the same GPUs (the same session), the state gone
        await km.restart_kernel()
        await kc.wait_for_ready(timeout=60)
        reply, _ = await run(kc, "x")
        assert reply["content"]["ename"] == "NameError"
        (again,) = gl_plane.call(gl_plane.cp.list_sessions())
        assert again.id == kernel.id
        assert free_gpus(gl_plane) == 1
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
    ended = gl_plane.call(gl_plane.cp.get_session(kernel.id))
    assert ended.job.state == JobState.CANCELLED
    assert free_gpus(gl_plane) == 2


async def test_a_kernel_outlives_the_relays_memory_as_after_a_restart(gl_plane: Plane) -> None:
    """What a control-plane restart loses is the relay's memory (keys, lanes): the session is
    restored from the store (ADR 0019). The Jupyter host re-attaches with its key; the kernel,
    its state and its client stay."""
    km, kc = await start()
    try:
        await run(kc, "y = 7")
        # The relay's memory (keys and lanes), gone as in a restart.
        gl_plane.call(_forget_kernels(gl_plane))
        reply, out = await run(kc, "print(y * 6)")
        assert reply["content"]["status"] == "ok"
        assert texts(out).strip() == "42"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()


async def _forget_kernels(plane: Plane) -> None:
    plane.cp.kernels._kernels.clear()
