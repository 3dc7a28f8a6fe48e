"""``gl_api``: a real ControlPlane + TokenService behind a real tornado server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import tornado.httpclient
import tornado.websocket

from gpulayer_kernel.api import ApiLimits, ApiServer
from gpulayer_kernel.clock import SYSTEM_CLOCK, Clock
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.security import TokenKind, TokenService
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore


@dataclass
class Api:
    url: str
    cp: ControlPlane
    tokens: TokenService
    server: ApiServer
    store: SqliteStore
    http: httpx.AsyncClient
    client_token: str
    join_token: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.url + "/api/v1"

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = "client",
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Any = None,
        timeout: float = 30.0,
    ) -> httpx.Response:
        """A raw request; ``token`` is a token, ``"client"``/``"join"``, or None for none."""
        if token == "client":
            token = self.client_token
        elif token == "join":
            token = self.join_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return await self.http.request(
            method,
            self.base + path,
            headers=headers,
            json=json,
            content=content,
            params=params,
            timeout=timeout,
        )

    async def new_token(self, kind: str, **kw: Any) -> str:
        _, secret = await self.tokens.create(TokenKind(kind), **kw)
        return secret

    async def join(self, name: str = "w1", **caps: Any) -> tuple[str, str]:
        """Enrol a worker over HTTP; returns (worker id, session token)."""
        reg = {"name": name, "transport": "http", **caps}
        r = await self.call("POST", "/workers/join", "join", json=reg)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["worker"]["id"], data["session_token"]


async def start_api(
    tmp_path: Path,
    *,
    limits: ApiLimits | None = None,
    heartbeat_timeout: float = 5.0,
    clock: Clock = SYSTEM_CLOCK,
    **kw: Any,
) -> Api:
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(
        store,
        LocalArtifactStore(tmp_path / "blobs"),
        clock=clock,
        heartbeat_timeout=heartbeat_timeout,
    )
    await cp.start()
    tokens = await TokenService(store).load()
    server = ApiServer(cp, tokens, limits=limits, **kw)
    url = await server.start("127.0.0.1", 0)
    _, client = await tokens.create(TokenKind.CLIENT, name="test")
    _, join = await tokens.create(TokenKind.JOIN, name="test-join")
    http = httpx.AsyncClient(trust_env=False)
    return Api(url, cp, tokens, server, store, http, client, join)


async def stop_api(api: Api) -> None:
    await api.http.aclose()
    await api.server.stop()
    await api.cp.close()
    await api.store.close()


@contextlib.asynccontextmanager
async def running_api(tmp_path: Path, **kw: Any) -> AsyncIterator[Api]:
    """``start_api(tmp_path, **kw)``, then ``stop_api`` whatever happens."""
    api = await start_api(tmp_path, **kw)
    try:
        yield api
    finally:
        await stop_api(api)


@pytest.fixture
async def gl_api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as api:
        yield api


async def raw_tunnel(
    api: Api, token: str | None, route: str
) -> tornado.websocket.WebSocketClientConnection:
    """A bare WebSocket to one of the API's tunnels (``route``: ``/tunnel``, ``/worker/tunnel``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ws_url = api.url.replace("http://", "ws://") + "/api/v1" + route
    return await tornado.websocket.websocket_connect(
        tornado.httpclient.HTTPRequest(ws_url, headers=headers)
    )


async def assert_tunnel_refused(api: Api, route: str, *tokens: str | None) -> None:
    """Each token is refused the tunnel's upgrade with 401 or 403 and a JSON error."""
    for token in tokens:
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            await raw_tunnel(api, token, route)
        assert refused.value.code in (401, 403), token
        assert refused.value.response is not None
        assert "code" in json.loads(refused.value.response.body)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
