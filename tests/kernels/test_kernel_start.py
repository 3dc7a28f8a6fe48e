"""A GPU kernel that waits for GPUs another kernel holds: it says why once per reason (the
sentence carries a changing age), fails after its ``--wait`` with that sentence, and the failure
is an HTTP answer jupyter_server can pass on (issue 33, items 5 and 6)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time

import pytest
from jupyter_client.manager import AsyncKernelManager
from tornado.web import HTTPError

from gpulayer_kernel import render
from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.kernels import spec

from .conftest import Plane
from .test_kernel_e2e import run, start, texts

pytestmark = pytest.mark.slow


def taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
            return True
        return False


async def test_a_kernel_waiting_behind_another_logs_each_reason_once_then_fails_after_its_wait(
    gl_plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    spec.install(gpus=2, gpu_kind=[], user=True, wait=3.5, name="gl-2gpu-short")
    km1, kc1 = await start("gpulayer-2gpu")  # holds both of w1's GPUs, idle
    try:
        km = AsyncKernelManager(kernel_name="gl-2gpu-short")
        began = time.monotonic()
        with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError) as err:
            starting = asyncio.ensure_future(km.start_kernel())
            # While it waits, the ports its connection file names are bound here already: a
            # port picked free and bound once placed could be taken meanwhile (EADDRINUSE).
            while not os.path.exists(km.connection_file) and not starting.done():
                await asyncio.sleep(0.05)
            ports = [v for k, v in km.get_connection_info().items() if k.endswith("_port")]
            assert len(ports) == 5 and all(taken(p) for p in ports), ports
            await starting
        took = time.monotonic() - began
        text = str(err.value)
        assert text.startswith("no GPU for this kernel within 3.5s (the kernel spec's --wait): ")
        assert "held by the idle session of" in text, text
        assert "waiting helps" in text, text
        assert 3.5 <= took < 15
        # The sentence changed every second ("idle ... for 1 s", "for 2 s"): one line all the same.
        waits = [r.getMessage() for r in caplog.records if " waits: " in r.getMessage()]
        assert len(waits) == 1, waits
        assert isinstance(err.value, HTTPError) and err.value.status_code == 503
        assert err.value.log_message == text  # what jupyter_server answers POST /api/kernels with
        states = [s.job.state for s in gl_plane.call(gl_plane.cp.list_sessions(include_ended=True))]
        assert sorted(states) == [JobState.CANCELLED, JobState.RUNNING]  # not left queued
        # A failed start leaves no port bound (jupyter_client cleans up nothing after it).
        deadline = time.monotonic() + 5
        while any(taken(p) for p in ports) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not any(taken(p) for p in ports), ports
    finally:
        kc1.stop_channels()
        await km1.shutdown_kernel()


async def test_the_kernel_sees_its_notebooks_name_as_a_local_kernel_does(gl_plane: Plane) -> None:
    """jupyter_server names the notebook in the kernel's environment (``JPY_SESSION_NAME``):
    the worker's kernel gets it too; a 2-GPU kernel is listed as one process (issue 33, item 6)."""
    km = AsyncKernelManager(kernel_name="gpulayer-2gpu")
    notebook = "/home/ada/analysis.ipynb"
    await km.start_kernel(env={"JPY_SESSION_NAME": notebook, "PATH": "/usr/bin"})
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        _, out = await run(kc, "import os\nprint(os.environ.get('JPY_SESSION_NAME'))")
        assert texts(out).strip() == notebook
        (info,) = gl_plane.call(gl_plane.cp.list_sessions())
        assert info.holder.notebook == notebook
        assert info.ranks == 1  # one ipykernel that sees both GPUs, not "2 ranks"
        line = render.session_line(info)
        assert ", GPU kernel, " in line and "rank" not in line, line
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
