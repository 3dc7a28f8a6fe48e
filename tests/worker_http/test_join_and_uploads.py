"""The worker's own transport against the hardened server (issue 12, items 5 and 8): a worker
that re-joins with the shared join token cannot become another worker, and an artifact upload
refused by the upload cap (503 ``uploads_busy``) is retried until a slot frees."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gpulayer_kernel.api import ApiLimits
from gpulayer_kernel.contracts import WorkerRegistration
from gpulayer_kernel.testing import FakeClock, until
from gpulayer_kernel.worker.http import HttpTransport

from ..api.conftest import start_api, stop_api


async def test_a_worker_claiming_another_s_id_with_the_join_token_gets_its_own(
    tmp_path: Path,
) -> None:
    api = await start_api(tmp_path, heartbeat_timeout=600)
    victim = HttpTransport(api.url, api.join_token)
    thief = HttpTransport(api.url, api.join_token)
    try:
        mine = await victim.register(WorkerRegistration(name="box"))
        thief.worker_id = mine.id  # what the transport sends when it re-joins: ?worker_id=
        theirs = await thief.register(WorkerRegistration(name="box"))
        assert theirs.id != mine.id and thief.worker_id == theirs.id
        await victim.heartbeat()  # the victim's session still stands
        assert victim.worker_id == mine.id
    finally:
        await victim.close()
        await thief.close()
        await stop_api(api)


async def test_an_artifact_upload_waits_out_the_upload_cap(tmp_path: Path) -> None:
    api = await start_api(tmp_path, limits=ApiLimits(max_uploads=1), heartbeat_timeout=600)
    clock = FakeClock()
    t = HttpTransport(api.url, api.join_token, clock=clock, retry_for=600)
    gate = asyncio.Event()
    head = b"held" * 1000

    async def held() -> AsyncIterator[bytes]:
        yield head
        await gate.wait()

    tasks: list[asyncio.Future[Any]] = []
    try:
        await t.register(WorkerRegistration(name="w"))
        # A user's bundle upload holds the only slot until the gate opens.
        hog = asyncio.ensure_future(
            api.http.put(
                f"{api.base}/bundles/{hashlib.sha256(head).hexdigest()}",
                content=held(),
                headers={"Authorization": f"Bearer {api.client_token}"},
            )
        )
        await until(lambda: api.server.context.uploads == 1, what="the hog to take the slot")
        data = b"an artifact"
        upload = asyncio.ensure_future(t.put_blob(data))
        tasks += [hog, upload]
        await until(lambda: clock.pending > 0, what="the refused upload to back off")
        assert not upload.done()
        gate.set()
        assert (await hog).status_code == 201
        await clock.advance(60)  # past the backoff: the retry finds the slot free
        assert await upload == hashlib.sha256(data).hexdigest()
        assert api.cp.artifacts.get(hashlib.sha256(data).hexdigest()) == data
        assert api.server.context.uploads == 0
    finally:
        gate.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await t.close()
        await stop_api(api)
