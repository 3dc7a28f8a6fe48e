"""A GPU kernel on a served control plane (issue 33): a real ``gpulayer serve``, a real
``gpulayer worker`` process, the provisioner's ``HttpLink`` — the kernel's messages on one
WebSocket stream per side. A 20 MB print is a note and the next cell answers; a flood of frames
to a kernel that is not placed is refused; a ``kill -9`` of the server under a live kernel keeps
its state; where WebSockets do not pass, the HTTP routes carry the same cells."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.contracts.kernels import OUTPUT_CAP, WAITING_BYTES
from gpulayer_kernel.display import human_bytes
from gpulayer_kernel.kernels.host import host
from gpulayer_kernel.kernels.link import HttpLink
from gpulayer_kernel.testing import ServeProcess, WorkerProcess

from .test_kernel_e2e import run, start, texts

pytestmark = pytest.mark.slow


@pytest.fixture
def served(gl_kernelspecs: None, tmp_path: Path) -> Iterator[ServeProcess]:
    """``gpulayer serve`` with one worker (2 simulated GPUs); the kernels' host links to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    with ServeProcess(tmp_path / "served", heartbeat_timeout=20, env=env) as server:
        join = server.create_token("join", ttl=600)
        worker = WorkerProcess(
            server.url, join, name="wk", simulate_gpus=2, home=tmp_path / "wk", env=env
        )
        with worker:
            h = host()
            h._link = HttpLink(server.url, server.admin_token)
            try:
                yield server
            finally:
                h.submit(h._link.close()).result(30)
                h._link = None


async def test_cells_travel_on_streams_and_a_huge_output_is_a_note(served: ServeProcess) -> None:
    km, kc = await start()
    try:
        reply, _ = await run(kc, "x = 41")
        assert reply["content"]["status"] == "ok"
        _, out = await run(kc, "print(x + 1)")
        assert texts(out).strip() == "42"
        # Issue 33, item 2: one message over the cap used to hang the kernel for good.
        reply, out = await run(kc, "print('x' * 20_000_000)")
        assert reply["content"]["status"] == "ok"
        note = texts(out)
        assert "[gpulayer] output dropped" in note and human_bytes(OUTPUT_CAP) in note
        assert len(note) < 1000
        _, out = await run(kc, "print(1 + 1)")
        assert texts(out).strip() == "2"
        # Under the cap, a big message travels whole (7 MiB: more than one HTTP body once held).
        _, out = await run(kc, "print('y' * (7 << 20))")
        assert texts(out).count("y") == 7 << 20
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()


async def test_a_kill_of_the_server_under_a_live_kernel_keeps_its_state(
    served: ServeProcess,
) -> None:
    km, kc = await start()
    try:
        await run(kc, "y = 7")
        served.restart(kill=True)  # kill -9, then the same port and home
        reply, out = await run(kc, "print(y * 6)")
        assert reply["content"]["status"] == "ok"
        assert texts(out).strip() == "42"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()


def test_frames_to_a_kernel_that_is_not_placed_are_bounded(served: ServeProcess) -> None:
    """Issue 33, item 3: a user's frames to a kernel that can never be placed were all taken
    (150 × 7.3 MB: 1.1 GiB held). Now a small buffer, then 429; a message too large for it, 413;
    and a part that is not base64, 422."""
    admin = {"Authorization": f"Bearer {served.admin_token}"}
    api = served.url + "/api/v1/"
    with httpx.Client(base_url=api, headers=admin, timeout=60) as h:
        h.post("users", json={"name": "mallory", "role": "user"}).raise_for_status()
        secret = h.post("tokens", json={"kind": "client", "user": "mallory"}).json()["secret"]
    mallory = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=api, headers=mallory, timeout=60) as h:
        start_req = {"gpus": 64, "key": "k" * 32, "holder": {"client": "m"}}
        kernel = h.post("kernels", json={**start_req, "wait_for_capacity": True}).json()["id"]

        def frames(size: int) -> dict[str, Any]:
            part = base64.b64encode(b"z" * size).decode()
            return {"frames": [{"channel": "shell", "parts": [part]}]}

        big = h.post(f"kernels/{kernel}/frames", json=frames(7_300_000))
        assert big.status_code == 413 and big.json()["code"] == "kernel_message_too_large"
        taken = 0
        while True:
            r = h.post(f"kernels/{kernel}/frames", json=frames(100_000))
            if r.status_code != 204:
                break
            taken += 100_000
        assert r.status_code == 429 and r.json()["code"] == "kernel_lane_full", r.text
        assert r.headers.get("Retry-After")
        assert taken <= WAITING_BYTES
        bad = {"frames": [{"channel": "shell", "parts": ["not base64!"]}]}
        r = h.post(f"kernels/{kernel}/frames", json=bad)
        assert r.status_code == 422 and r.json()["code"] == "bad_frame"
        h.post(f"sessions/{kernel}/stop").raise_for_status()
        gone = h.post(f"kernels/{kernel}/frames", json=frames(10))
        assert gone.status_code == 409 and gone.json()["code"] == "kernel_ended", gone.text
