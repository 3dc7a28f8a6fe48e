"""The worker tunnel (``api/tunnel.py``, ``wire/tunnel.py``; issue 35): a worker's small requests
on one WebSocket, answered by the same routes as over HTTP, and HTTP wherever there is none."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest
import tornado.httpclient
import tornado.httpserver
import tornado.netutil
import tornado.web
import tornado.websocket

from gpulayer_kernel import bundles
from gpulayer_kernel.api.app import PREFIX
from gpulayer_kernel.api.routes import worker_handlers
from gpulayer_kernel.api.tunnel import MAX_OPEN, WorkerTunnel
from gpulayer_kernel.client.clients import AsyncClient
from gpulayer_kernel.contracts import (
    CommandWorkload,
    JobSpec,
    JobState,
    PythonWorkload,
    WorkerRegistration,
)
from gpulayer_kernel.contracts.limits import MAX_BODY
from gpulayer_kernel.errors import Unauthorized, Unavailable
from gpulayer_kernel.security.tls import server_context
from gpulayer_kernel.testing import until
from gpulayer_kernel.wire.tunnel_frames import MISDIRECTED, pack, unpack
from gpulayer_kernel.worker.http import HttpTransport

from ..api.conftest import Api, assert_tunnel_refused, raw_tunnel, start_api, stop_api


def tunnels(api: Api) -> list[WorkerTunnel]:
    return [s for s in api.server.context.streams if isinstance(s, WorkerTunnel)]


async def joined(api: Api, url: str | None = None) -> HttpTransport:
    t = HttpTransport(url or api.url, api.join_token, retry_for=5, tunnel=True)
    await t.register(WorkerRegistration(name="wt"))
    return t


async def test_a_long_poll_the_tunnel_s_close_cuts_makes_the_worker_suspect(api: Api) -> None:
    t = await joined(api)
    poll = asyncio.ensure_future(t.next_work(20))
    await until(lambda: bool(tunnels(api)) and bool(tunnels(api)[0].exchanges), 5)
    await t.close()  # the worker goes away mid-poll: its tunnel closes, the long-poll with it
    with pytest.raises(Unavailable, match="the worker tunnel closed"):
        await poll  # as a long-poll whose HTTP connection its worker closed

    async def suspect() -> bool:
        [w] = await api.cp.workers()
        return w.suspect is not None and "connection closed" in w.suspect

    await until(suspect, 5, what="the worker to be suspect")


async def test_a_long_poll_its_worker_gives_up_is_heard_as_a_closed_connection(
    api: Api,
) -> None:
    """A stopping worker cancels its long-poll: over HTTP that closes its connection, and the
    server places nothing more on it. On the tunnel the connection stays open for the other
    requests, so the worker says it gave up, and the server hears the same."""
    t = await joined(api)
    try:
        poll = asyncio.ensure_future(t.next_work(20))
        await until(lambda: bool(tunnels(api)) and bool(tunnels(api)[0].exchanges), 5)
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll

        async def suspect() -> bool:
            [w] = await api.cp.workers()
            return w.suspect is not None and "connection closed" in w.suspect

        await until(suspect, 5, what="the worker to be suspect")
        [tunnel] = tunnels(api)
        assert not tunnel.exchanges  # forgotten: its answer, if one comes, is not sent
        await t.heartbeat()  # the tunnel itself stays open for the worker's other requests
        assert tunnels(api) == [tunnel]
    finally:
        await t.close()


async def test_a_host_without_the_tunnel_is_spoken_to_over_http(api: Api) -> None:
    """A Jupyter server hosting the control plane mounts the worker routes and no tunnel (as a
    control plane from before it): the worker's requests go over HTTP, and it tries later."""
    app = tornado.web.Application(
        worker_handlers(PREFIX, api.cp, api.tokens, context=api.server.context)
    )
    [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets([sock])
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    t = await joined(api, url)
    try:
        job = await api.cp.submit(
            JobSpec(workload=CommandWorkload(argv=["true"]), resources={"worker": "wt"})
        )
        work = await t.next_work(5)
        assert [a.job.id for a in work.assignments] == [job.id]
        await t.report_started(job.id)
        assert (await api.cp.get(job.id)).state == JobState.RUNNING
        [tunnel] = t.wire._tunnels.values()
        assert tunnel._conn is None and tunnel._retry_at > 0  # not there: tried again later
    finally:
        await t.close()
        server.stop()


async def test_an_answer_too_large_for_a_message_is_sent_back_to_http(api: Api) -> None:
    """A bundle larger than a message: the worker fetches it over HTTP (streamed), and asked
    on the tunnel anyway, the server drops it as it is written and answers 421."""
    files = {"run.py": b"print(1)\n", "big.bin": os.urandom(MAX_BODY + (1 << 20))}
    digest, data = bundles.build(files)
    async with AsyncClient(api.url, api.client_token) as c:
        await c.put_bundle(data)
    t = await joined(api)
    try:
        spec = JobSpec(
            workload=PythonWorkload(bundle=digest, entrypoint="run.py"), resources={"worker": "wt"}
        )
        job = await api.cp.submit(spec)
        work = await t.next_work(5)
        assert [a.job.id for a in work.assignments] == [job.id]
        assert await t.fetch_blob(digest) == data  # over HTTP: the tunnel never takes blobs
        conn = await _raw(api, t.session_token)
        auth = {"Authorization": f"Bearer {t.session_token}"}
        url = f"{PREFIX}/worker/blobs/{digest}"
        await conn.write_message(pack({"i": 7, "m": "GET", "u": url, "h": auth}), binary=True)
        header, body = unpack(await conn.read_message())  # type: ignore[arg-type]
        assert header["s"] == MISDIRECTED and "larger" in json.loads(body)["message"]
        conn.close()
    finally:
        await t.close()


async def test_a_session_revoked_while_its_tunnel_is_open_is_refused_on_it(api: Api) -> None:
    t = await joined(api)
    try:
        await t.heartbeat()
        [tunnel] = tunnels(api)
        await api.tokens.revoke_where(lambda r: r.worker_id == t.worker_id)
        with pytest.raises(Unauthorized):
            await t.heartbeat()
        assert tunnels(api) == [tunnel] and tunnel.answered == 2  # checked per request, on it
    finally:
        await t.close()


async def test_the_tunnel_runs_over_tls_with_a_private_ca(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    api = await start_api(tmp_path, ssl_context=server_context(str(cert_file), str(key_file)))
    t = HttpTransport(api.url, api.join_token, retry_for=5, tunnel=True, ca_cert=str(ca_file))
    try:
        assert api.url.startswith("https://")
        await t.register(WorkerRegistration(name="wt"))
        await t.heartbeat()
        [tunnel] = tunnels(api)  # wss, verified against the same CA as the worker's HTTP
        assert tunnel.answered == 1
    finally:
        await t.close()
        await stop_api(api)


async def _raw(api: Api, token: str | None) -> tornado.websocket.WebSocketClientConnection:
    return await raw_tunnel(api, token, "/worker/tunnel")


async def test_the_tunnel_refuses_callers_without_a_worker_token(api: Api) -> None:
    bad = "glt_w_0123456789ab_" + "x" * 43
    await assert_tunnel_refused(api, "/worker/tunnel", None, api.client_token, bad)


async def test_what_the_tunnel_does_not_take_is_sent_back_to_http(api: Api) -> None:
    t = await joined(api)
    try:
        conn = await _raw(api, t.session_token)
        # A user route, even with a token that may call it: 421, the worker uses HTTP.
        auth = {"Authorization": f"Bearer {api.client_token}"}
        await conn.write_message(
            pack({"i": 1, "m": "GET", "u": PREFIX + "/jobs", "h": auth}), binary=True
        )
        header, body = unpack(await conn.read_message())  # type: ignore[arg-type]
        assert header["i"] == 1 and header["s"] == MISDIRECTED
        assert json.loads(body)["code"] == "not_over_tunnel"
        # A worker route is answered as over HTTP: its own token is checked, its errors kept.
        await conn.write_message(
            pack({"i": 2, "m": "POST", "u": PREFIX + "/worker/heartbeat", "h": {}}), binary=True
        )
        header, body = unpack(await conn.read_message())  # type: ignore[arg-type]
        assert header["i"] == 2 and header["s"] == 401
        assert json.loads(body)["code"]
        # Past MAX_OPEN open requests (long-polls held), the next is sent back to HTTP.
        mine = {"Authorization": f"Bearer {t.session_token}"}
        for i in range(MAX_OPEN + 1):
            poll = {"i": 100 + i, "m": "GET", "u": PREFIX + "/worker/work?wait=20", "h": mine}
            await conn.write_message(pack(poll), binary=True)
        header, body = unpack(await conn.read_message())  # type: ignore[arg-type]
        assert header["s"] == MISDIRECTED and "requests open" in json.loads(body)["message"]
        # Not a tunnel message: the tunnel closes.
        await conn.write_message(b"\x00\x00\x00\xffnot json", binary=True)
        while (message := await conn.read_message()) is not None:  # the held polls may answer
            assert isinstance(message, bytes) and unpack(message)[0]["s"] != 500
        assert conn.close_code == 1003
        conn.close()
    finally:
        await t.close()


async def test_a_server_that_stops_closes_the_tunnel_and_the_worker_moves_on(
    tmp_path: Path,
) -> None:
    api = await start_api(tmp_path, heartbeat_timeout=5.0)
    t = await joined(api)
    try:
        await t.heartbeat()
        assert tunnels(api)
        await api.http.aclose()
        await api.server.stop()
        poll = asyncio.ensure_future(t.next_work(1))
        with pytest.raises(Unavailable) as down:  # the tunnel closed, HTTP finds no server
            await poll
        assert down.value.code == "server_unreachable"
    finally:
        await t.close()
        await api.cp.close()
        await api.store.close()
