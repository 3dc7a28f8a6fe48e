"""The caller's end of a tunnel (``api/tunnel.py``; issue 35): small requests on one WebSocket.

A :class:`Tunnel` is what a :class:`~gpulayer_kernel.wire.http.Wire` made with ``tunnel=`` sends
its small requests through: each ``Req`` becomes one message, its answer one message back, as an
``httpx.Response``, so the wire's failover, error mapping and the callers do not tell the two
apart. Many requests share the connection at once (a long-poll and a report).

Two sides: a worker's (``/worker/tunnel``: ``/worker/...`` routes) and a client's (``/tunnel``:
the other routes), each with a JSON body or none (bundles', artifacts' and workspaces' bytes go
over HTTP, as everything else does). A worker waits for its tunnel to open (it sends requests for
as long as it runs); a client opens its tunnel in the background at its second request, and sends
over HTTP until it is open, so that a client making one request never opens one. When the tunnel
is not there (a control plane from before it, a Jupyter host, a proxy that refuses WebSockets) or
cannot be opened, requests go over HTTP, and the tunnel is tried again later (``RETRY_AFTER``,
doubling). A connection lost with requests on it fails them as a dropped HTTP connection fails its
request (``httpx.ReadError``), so what the wire does next (send it again, or not) is what it does
over HTTP. A request its caller stops waiting for is said so to the server, as a closed HTTP
connection would say it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode, urlsplit

import httpx

from ..client.httpbase import api_base
from ..contracts.limits import MAX_BODY
from .tunnel_frames import HEADROOM, MISDIRECTED, pack, unpack

if TYPE_CHECKING:
    from tornado.websocket import WebSocketClientConnection as Connection

log = logging.getLogger("gpulayer.wire")
OPEN_TIMEOUT = 10.0  # seconds a request waits for its worker's tunnel to open (then: HTTP)

RETRY_AFTER = 5.0  # seconds before a tunnel that could not be opened is tried again (doubling)
RETRY_MAX = 300.0
# Routes of bytes, in or out, any size: HTTP streams them.
BYTE_ROUTES = ("/blobs/", "/workspace/objects", "/artifacts/", "/bundles/", "/dist/")
Side = Literal["worker", "client"]
ROUTES: dict[Side, str] = {"worker": "/worker/tunnel", "client": "/tunnel"}
METHODS: dict[Side, tuple[str, ...]] = {
    "worker": ("GET", "POST"),
    "client": ("GET", "POST", "PUT", "PATCH", "DELETE"),
}


def _closed_error() -> type[Exception]:
    """tornado's closed-connection error (loaded once a tunnel is open: only then raised)."""
    import tornado.websocket

    return tornado.websocket.WebSocketClosedError


class TunnelDown(Exception):
    """The request was not sent on the tunnel (none is open): send it over HTTP."""


class Tunnel:
    """One caller's tunnel to one control-plane URL (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token: Callable[[], str | None],
        *,
        ca_cert: str | None = None,
        side: Side = "worker",
    ) -> None:
        self.url = url
        self.token = token
        self.ca_cert = ca_cert
        self.side = side
        self._asked = 0  # requests it was offered (a client opens it at its second)
        self._base = urlsplit(api_base(url)).path  # "/api/v1"
        self._conn: Connection | None = None
        self._opening: asyncio.Task[Connection | None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[httpx.Response]] = {}
        self._ids = itertools.count(1)
        self._retry_at = 0.0  # monotonic time before which no new open is tried
        self._backoff = RETRY_AFTER
        self._closed = False
        self._told = False  # that the tunnel could not be opened (logged once at INFO)
        self.answered = 0  # requests answered on it (for diagnostics and tests)

    def takes(self, method: str, path: str, kwargs: dict[str, Any]) -> bool:
        """Whether a request goes on the tunnel: one of its side's routes with a JSON body or
        none, whose answer is not bytes (a bundle, a workspace pack: streamed over HTTP, never
        held)."""
        if path.startswith("/worker/") != (self.side == "worker"):
            return False
        if method not in METHODS[self.side] or path.endswith("/stream"):
            return False
        if any(part in path for part in BYTE_ROUTES):
            return False
        headers = kwargs.get("headers") or {}
        content = kwargs.get("content")
        if content is None:
            return True
        return headers.get("Content-Type") == "application/json" and len(content) <= MAX_BODY

    async def request(
        self,
        method: str,
        path: str,
        *,
        timeout: httpx.Timeout,
        params: list[tuple[str, str]] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request and wait for its answer; ``TunnelDown`` if it was not sent."""
        conn = await self._open(timeout)
        ident = next(self._ids)
        uri = self._base + path + (f"?{urlencode(params)}" if params else "")
        fut: asyncio.Future[httpx.Response] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = fut
        message = pack({"i": ident, "m": method, "u": uri, "h": headers or {}}, content or b"")
        try:
            try:
                await conn.write_message(message, binary=True)
            except _closed_error():
                raise TunnelDown("the tunnel closed") from None
            answer = await asyncio.wait_for(fut, timeout.read)
            self.answered += 1
            return answer
        except TimeoutError:
            self._abandon(conn, ident)
            raise httpx.ReadTimeout(f"no answer on the tunnel in {timeout.read}s") from None
        except asyncio.CancelledError:
            # As httpx closes the connection of a request its caller gave up: the server must
            # hear it (a stopping worker's long-poll: or work is placed on a worker that left).
            self._abandon(conn, ident)
            raise
        finally:
            self._waiting.pop(ident, None)

    def _abandon(self, conn: Connection, ident: int) -> None:
        """Tell the server this request's answer is no longer awaited (a closed connection)."""
        if self._conn is not conn:
            return  # that connection is gone: the server heard its close
        with contextlib.suppress(_closed_error()):
            conn.write_message(pack({"i": ident, "x": True}), binary=True).add_done_callback(
                lambda f: f.exception()
            )

    async def aclose(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
        for task in (self._opening, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # -- the connection ---------------------------------------------------------------------------

    async def _open(self, timeout: httpx.Timeout) -> Connection:
        if self._conn is not None:
            return self._conn
        self._asked += 1
        if self._closed or time.monotonic() < self._retry_at:
            raise TunnelDown("no tunnel now")
        if self.side == "client" and self._asked < 2:
            raise TunnelDown("one request is not worth a tunnel")
        if self._opening is None or self._opening.done():
            self._opening = asyncio.ensure_future(self._connect())
        if self.side == "client":  # over HTTP until it is open: a client never waits for it
            raise TunnelDown("the tunnel is opening")
        try:
            conn = await asyncio.wait_for(
                asyncio.shield(self._opening), min(timeout.connect or OPEN_TIMEOUT, OPEN_TIMEOUT)
            )
        except TimeoutError:
            conn = None
        if conn is None:
            raise TunnelDown("the tunnel could not be opened")
        return conn

    async def _connect(self) -> Connection | None:
        token = self.token()
        if not token:
            return None  # not joined yet: nothing to open it with
        # wire/stream.py, and with it tornado's WebSocket client (~50 ms of imports), loaded
        # off the event loop when a tunnel first opens: never by a client that opens none.
        stream = await asyncio.to_thread(importlib.import_module, f"{__package__}.stream")
        import tornado.websocket
        from tornado.httpclient import HTTPClientError

        request = stream.upgrade_request(self.url, ROUTES[self.side], token, self.ca_cert)
        try:
            conn: Connection = await stream.connect(request, MAX_BODY + HEADROOM)
        except (HTTPClientError, OSError, tornado.websocket.WebSocketError, TimeoutError) as exc:
            # An older control plane or a proxy (404, 400), a refusal, or no server: HTTP says
            # which to the request itself; the tunnel is tried again later.
            # Said once (a host without it stays without it), then only when debugging.
            log.log(
                logging.DEBUG if self._told else logging.INFO,
                "no %s tunnel to %s (%s); its requests go over HTTP, the tunnel is tried "
                "again in %.0f s",
                self.side,
                self.url,
                exc,
                self._backoff,
            )
            self._told = True
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, RETRY_MAX)
            return None
        stream.no_delay(conn)
        if self._closed:
            conn.close()
            return None
        self._backoff = RETRY_AFTER
        self._conn = conn
        self._reader = asyncio.ensure_future(self._read(conn))
        return conn

    async def _read(self, conn: Connection) -> None:
        try:
            while True:
                message = await conn.read_message()
                if message is None:
                    return
                if not isinstance(message, bytes):
                    continue
                try:
                    header, body = unpack(message)
                    ident, status = int(header["i"]), int(header["s"])
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("%s tunnel to %s: %s; closing it", self.side, self.url, exc)
                    return
                fut = self._waiting.get(ident)
                if fut is not None and not fut.done():
                    fut.set_result(
                        httpx.Response(status, headers=dict(header.get("h") or {}), content=body)
                    )
        finally:
            if self._conn is conn:
                self._conn = None
            conn.close()
            # Requests on it are lost as on a dropped HTTP connection: the wire decides.
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(httpx.ReadError(f"the {self.side} tunnel closed"))


class Tunneled:
    """A URL's tunnel, and its pool for what the tunnel does not take or while it is down."""

    def __init__(self, tunnel: Tunnel, pool: httpx.AsyncClient) -> None:
        self.tunnel = tunnel
        self.pool = pool

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self.tunnel.takes(method, path, kwargs):
            try:
                answer = await self.tunnel.request(method, path, **kwargs)
            except TunnelDown:
                answer = None  # not sent: over HTTP, as without a tunnel
            if answer is not None and answer.status_code != MISDIRECTED:
                return answer
        return await self.pool.request(method, path, **kwargs)
