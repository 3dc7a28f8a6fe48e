"""Two users start GPU kernels while a group quota applies (issue 27, "bad inputs").

Each user's Jupyter host acts as that user (``CpLink(cp, who)``, as a served control plane
learns the user from the host's token). Alice and Bob share group ``team``, capped at 1 GPU;
worker w1 has 2. Alice's kernel runs; Bob's waits on the quota, not on the GPUs, and his start
fails after his spec's ``--wait`` with the queue's sentence naming the quota; asking for more
GPUs than the quota allows at all is refused at once (429 ``quota_exceeded``). Alice's kernel
keeps its state and answers throughout.
"""

from __future__ import annotations

import time

import pytest
from jupyter_client.manager import AsyncKernelManager

from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.kernels import spec
from gpulayer_kernel.kernels.host import use_link
from gpulayer_kernel.kernels.link import CpLink
from gpulayer_kernel.security.roles import Identity, Role

from .conftest import Plane
from .test_kernel_e2e import free_gpus, run, start, texts

pytestmark = pytest.mark.slow

ALICE = Identity("alice", Role.USER)
BOB = Identity("bob", Role.USER)


async def test_the_second_user_over_the_group_quota_gets_the_reason_and_the_first_keeps_working(
    gl_plane: Plane,
) -> None:
    spec.install(gpus=1, gpu_kind=[], user=True, wait=1.5, name="gpulayer-1gpu-quick")
    users = gl_plane.cp.users
    for name in ("alice", "bob"):
        gl_plane.call(users.add(name, Role.USER, group="team"))
    gl_plane.call(users.set_quota("group:team", max_gpus=1))

    use_link(CpLink(gl_plane.cp, ALICE))
    km, kc = await start()
    try:
        reply, _ = await run(kc, "x = 41")
        assert reply["content"]["status"] == "ok"

        use_link(CpLink(gl_plane.cp, BOB))
        began = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            await AsyncKernelManager(kernel_name="gpulayer-1gpu-quick").start_kernel()
        text = str(err.value)
        assert "no GPU for this kernel within 1.5s" in text, text
        assert "group team is at its quota (1/1 GPUs; waiting helps)" in text, text
        assert time.monotonic() - began < 15

        with pytest.raises(GPUlayerError) as refused:
            await AsyncKernelManager(kernel_name="gpulayer-2gpu").start_kernel()
        assert refused.value.code == "quota_exceeded" and refused.value.status == 429
        assert "the quota of group team is 1" in refused.value.message

        ended = gl_plane.call(gl_plane.cp.list_sessions(include_ended=True))
        bobs = [s for s in ended if s.job.owner == "bob"]
        assert [s.job.state for s in bobs] == [JobState.CANCELLED]  # nothing left queued
        assert free_gpus(gl_plane) == 1  # the quota held Bob back, not the GPUs

        use_link(CpLink(gl_plane.cp, ALICE))
        reply, seen = await run(kc, "print(x + 1)")
        assert reply["content"]["status"] == "ok" and texts(seen) == "42\n"
        (alices,) = [s for s in ended if s.job.owner == "alice"]
        assert alices.kernel and alices.job.state == JobState.RUNNING
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
