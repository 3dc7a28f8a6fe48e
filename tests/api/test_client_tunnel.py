"""The client tunnel (``api/tunnel.py``'s ``ClientTunnel``, ``wire/tunnel.py``; issue 35): a
client's small requests on one WebSocket from its second request on, answered by the same routes
as over HTTP; bytes, one-request clients and hosts without it over HTTP."""

from __future__ import annotations

import json
import os

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.api.app import PREFIX
from gpulayer_kernel.api.tunnel import ClientTunnel
from gpulayer_kernel.client.clients import AsyncClient
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
from gpulayer_kernel.errors import NotFound, Unauthorized
from gpulayer_kernel.testing import until
from gpulayer_kernel.wire.tunnel_frames import MISDIRECTED, pack, unpack

from .conftest import Api, assert_tunnel_refused, raw_tunnel


def tunnels(api: Api) -> list[ClientTunnel]:
    return [s for s in api.server.context.streams if isinstance(s, ClientTunnel)]


def spec(*argv: str) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)))


async def opened(api: Api, c: AsyncClient) -> ClientTunnel:
    """The client's tunnel, once a second request has opened it."""
    for _ in range(2):
        await c.workers()
    [t] = c.wire._tunnels.values()
    await until(lambda: t._conn and tunnels(api), 5, what="the client tunnel to open")
    [tunnel] = tunnels(api)
    return tunnel


async def test_a_client_s_calls_go_on_its_tunnel_from_its_second_request(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        job = await c.submit(spec("sleep", "30"))
        [t] = c.wire._tunnels.values()
        assert t._opening is None and not tunnels(gl_api)  # one request opens nothing
        tunnel = await opened(gl_api, c)
        before = tunnel.answered
        assert (await c.get(job.id)).id == job.id
        cancelled = await c.cancel(job.id)  # a POST with a query, keyed: as over HTTP
        assert cancelled.cancel_requested or cancelled.state == JobState.CANCELLED
        assert [j.id for j in await c.list()] == [job.id]
        assert tunnel.answered == before + 3
        # Errors are the routes' own, with their codes, as over HTTP.
        with pytest.raises(NotFound) as missing:
            await c.get("0123456789ab")
        assert missing.value.code == "job_not_found"
        assert tunnel.answered == before + 4
    await until(lambda: not tunnels(gl_api), 5, what="the tunnel to close with its client")


async def test_bytes_go_over_http_and_json_on_the_tunnel(gl_api: Api) -> None:
    data_digest, data = bundles.build({"run.py": b"print(1)\n", "blob": os.urandom(1 << 16)})
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        tunnel = await opened(gl_api, c)
        before = tunnel.answered
        assert await c.put_bundle(data) == data_digest  # bytes up: HTTP
        assert await c.get_bundle(data_digest) == data  # bytes down: HTTP
        assert await c.has_bundle(data_digest)  # HEAD: HTTP
        assert tunnel.answered == before
        await c.workers()
        assert tunnel.answered == before + 1


async def test_a_client_with_a_bad_token_opens_no_tunnel_and_hears_why_over_http(
    gl_api: Api,
) -> None:
    async with AsyncClient(gl_api.url, "glt_c_0123456789ab_" + "x" * 43) as c:
        for _ in range(3):
            with pytest.raises(Unauthorized):
                await c.workers()
        [t] = c.wire._tunnels.values()
        await until(lambda: t._retry_at > 0, 5, what="the refused tunnel to be tried later")
        assert t._conn is None and not tunnels(gl_api)


async def test_the_client_tunnel_takes_client_tokens_and_routes_only(gl_api: Api) -> None:
    bad = "glt_c_0123456789ab_" + "x" * 43
    await assert_tunnel_refused(gl_api, "/tunnel", None, gl_api.join_token, bad)
    conn = await raw_tunnel(gl_api, gl_api.client_token, "/tunnel")
    try:
        auth = {"Authorization": f"Bearer {gl_api.client_token}"}
        # A worker route, the tunnel itself, a kernel's stream: 421, the caller uses HTTP.
        for i, path in enumerate(("/worker/heartbeat", "/tunnel", "/kernels/k1/stream")):
            await conn.write_message(
                pack({"i": i, "m": "GET", "u": PREFIX + path, "h": auth}), binary=True
            )
            header, body = unpack(await conn.read_message())  # type: ignore[arg-type]
            assert (header["i"], header["s"]) == (i, MISDIRECTED)
            assert json.loads(body)["code"] == "not_over_tunnel"
        # A user route with no token of its own: refused as over HTTP (the tunnel's is not lent).
        await conn.write_message(
            pack({"i": 9, "m": "GET", "u": PREFIX + "/jobs", "h": {}}), binary=True
        )
        header, body = unpack(await conn.read_message())  # type: ignore[arg-type]
        assert (header["i"], header["s"]) == (9, 401)
    finally:
        conn.close()


async def test_gpulayer_no_tunnel_keeps_a_client_on_http(
    gl_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_NO_TUNNEL", "1")
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        for _ in range(3):
            await c.workers()
        assert c.wire.tunnel is None and not c.wire._tunnels and not tunnels(gl_api)
    monkeypatch.setenv("GPULAYER_NO_TUNNEL", "0")
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        await opened(gl_api, c)
