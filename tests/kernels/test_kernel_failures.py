"""GPU kernels under bad inputs: more GPUs than any worker has, a worker lost mid-cell."""

from __future__ import annotations

import time

import pytest
from jupyter_client.manager import AsyncKernelManager

from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.kernels import spec

from .conftest import Plane
from .test_kernel_e2e import start

pytestmark = pytest.mark.slow


async def test_a_kernel_no_worker_can_ever_place_fails_at_once_with_the_queues_sentence(
    gl_plane: Plane,
) -> None:
    """Issue 33, item 5: it used to wait out its whole --wait although the sentence already
    said "waiting won't help"; the scheduler's report says so (``never_fits``)."""
    spec.install(gpus=4, gpu_kind=[], user=True, wait=600, name="gl-4gpu-long")
    km = AsyncKernelManager(kernel_name="gl-4gpu-long")  # --wait 600; w1 has 2 GPUs
    began = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        await km.start_kernel()
    took = time.monotonic() - began
    text = str(err.value)
    assert text.startswith("no worker here can ever run this GPU kernel: 0/1 workers can run")
    assert "need 4; waiting won't help" in text, text  # the scheduler's one sentence
    assert took < 15  # not 600 s
    (ended,) = gl_plane.call(gl_plane.cp.list_sessions(include_ended=True))
    assert ended.kernel and ended.job.state == JobState.CANCELLED  # it did not stay queued


async def test_a_worker_lost_mid_cell_ends_the_cell_with_kernel_died(gl_plane: Plane) -> None:
    km, kc = await start()
    try:
        msg_id = kc.execute("import time\ntime.sleep(60)")
        while True:  # the cell runs on w1 once the kernel echoes its input
            msg = await kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
                break
        gl_plane.call(gl_plane.cp.remove_worker("w1", force=True))
        errors = []
        while True:
            msg = await kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                errors.append(msg["content"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert errors and errors[0]["evalue"].startswith("kernel died: worker w1 was lost")
        reply = await kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:  # wait_for_ready's own replies
            reply = await kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"
        assert not await km.is_alive()  # Jupyter's restarter sees the death
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
