"""The client end of a reliable message stream over a WebSocket (ADR 0021; issues 33, 35).

One :class:`Stream` carries one kernel's messages between a side (the Jupyter host, or the
worker running the kernel) and the control plane, both ways, over one kept-open WebSocket
instead of a long-poll and a POST per step. It is outbound only (a worker behind NAT opens it
as it opens its long-polls), authenticated by the token on connect, and reliable across
reconnects and failover:

- every message this side sends is numbered (its writer's own count); the server acknowledges
  what it took, and what it did not acknowledge is sent again after a reconnect (the server says
  on connect the last it took from this writer, ``applied``, so nothing is taken twice);
- the messages the server sends carry the lane's numbers; this side acknowledges what its reader
  has consumed (``receive(since)``), and a reconnect asks from there (``?since=``), so a message
  lost in a broken connection comes again;
- the server's word (``b"S"``: the kernel's status, a refusal) is kept as ``status``.

A connection that cannot be made moves to the next URL of the control plane (``ha/failover``)
and retries with backoff; an answer that refuses the stream (401, 403, a kernel that is not
there) is raised to the next ``send``/``receive``; a server or proxy without WebSockets raises
:class:`StreamUnsupported`, and the caller falls back to the HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import tornado.httpclient
import tornado.websocket

from .. import versions
from ..client.httpbase import api_base
from ..codes import ErrorCode
from ..contracts import PROTOCOL
from ..contracts.kernels import MAX_MESSAGE
from ..errors import GPUlayerError, Unavailable, from_json
from ..ha.failover import MOVE_CODES, Servers
from ..security.tls import client_verify
from .kernels import (
    ACK,
    MSG,
    STATE,
    KernelMessage,
    decode,
    decode_ack,
    decode_state,
    encode,
    encode_ack,
)

log = logging.getLogger("gpulayer.wire")

CONNECT_TIMEOUT = 10.0  # seconds to open a connection and be answered (a hung server: next URL)
PING_EVERY = 15.0  # seconds between pings; one unanswered for as long means a dead connection
UNACKED_BYTES = 16 << 20  # bytes sent and not yet acknowledged before ``send`` waits


class StreamUnsupported(GPUlayerError):
    """The server (an older one) or a proxy on the way does not take the stream: use HTTP."""

    code = "stream_unsupported"
    status = 501


class Stream:
    """One reliable, reconnecting stream of kernel messages (see the module docstring)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        path: str,
        token: str | Callable[[], str],
        *,
        ca_cert: str | None = None,
        on_status: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.servers = Servers(urls)
        self.path = path
        self.token = token  # or a callable: a worker's session token changes when it re-joins
        self.ca_cert = ca_cert
        self.on_status = on_status
        self.status: dict[str, Any] = {}
        self.connected = asyncio.Event()
        self.down_since: float | None = time.time()  # when the stream was last lost (None: up)
        self._writer = secrets.token_hex(8)
        self._seq = 0  # this writer's last message number
        self._unacked: deque[tuple[int, KernelMessage]] = deque()
        self._unacked_bytes = 0
        self._drained = asyncio.Event()
        self._inbox: deque[tuple[int, KernelMessage]] = deque()
        self._got = 0  # the last lane number received
        self._consumed = 0  # the reader's cursor: acknowledged, or asked from on a reconnect
        self._acked = 0  # the cursor last told to the server
        self._news = asyncio.Event()
        self._conn: tornado.websocket.WebSocketClientConnection | None = None
        # The connection took what a reconnect sends again: until then a new message waits its
        # turn (written before the older ones, it would be taken first, and the older ones,
        # numbered lower, dropped by the server as taken already).
        self._resent = False
        self._task: asyncio.Task[None] | None = None
        self._error: GPUlayerError | None = None
        self._settled = asyncio.Event()  # the first connection was made, or refused
        self._closed = False

    # -- the caller's side -----------------------------------------------------------------------

    async def send(self, messages: Sequence[KernelMessage]) -> None:
        """Send messages in order; they are kept until the server took them. Waits while too
        much is unacknowledged (the server pushes back when its lane is full)."""
        await self._ready()
        for m in messages:
            while self._unacked and self._unacked_bytes + m.size > UNACKED_BYTES:
                self._drained.clear()
                await self._drained.wait()
                self._raise()
            self._seq += 1
            self._unacked.append((self._seq, m))
            self._unacked_bytes += m.size
            if self._conn is not None and self._resent:
                with contextlib.suppress(tornado.websocket.WebSocketClosedError):
                    await self._conn.write_message(encode(self._seq, m), binary=True)

    async def receive(self, since: int, wait: float) -> list[tuple[int, KernelMessage]]:
        """Messages numbered after ``since`` (which acknowledges what came before), waiting up
        to ``wait`` seconds for one; the status may have changed meanwhile (``status``)."""
        await self._ready()
        self._consume(since)
        if not self._inbox and wait > 0:
            self._news.clear()
            self._raise()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), wait)
        self._raise()
        return list(self._inbox)

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # -- internals --------------------------------------------------------------------------------

    async def _ready(self) -> None:
        """Connect on first use: a refusal (401, 403, a kernel not there) is raised to the call
        that asked first, not to a later one."""
        if self._task is None or self._task.done():
            if self._error is None:
                self._settled.clear()
            self._task = asyncio.ensure_future(self._run())
        if not self._settled.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), CONNECT_TIMEOUT)
        self._raise()

    def _raise(self) -> None:
        """A refusal is raised once; the next call connects again (a re-attached kernel)."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _consume(self, since: int) -> None:
        while self._inbox and self._inbox[0][0] <= since:
            self._inbox.popleft()
        if since > self._consumed:
            self._consumed = since
            if self._conn is not None and since > self._acked:
                self._acked = since
                _write_soon(self._conn, encode_ack(since))

    async def _run(self) -> None:
        tries = 0
        while not self._closed:
            try:
                conn = await self._connect()
            except StreamUnsupported as exc:
                self._fail(exc)
                return
            except GPUlayerError as exc:
                if exc.status in (401, 403, 404, 409, 422):
                    self._fail(exc)
                    return
                log.info("stream %s: %s; trying again", self.path, exc.message)
                self.servers.current = (self.servers.current + 1) % len(self.servers.urls)
                await asyncio.sleep(min(5.0, 0.1 * 2**tries))  # retry backoff
                tries += 1
                continue
            tries = 0
            self._conn = conn
            self.down_since = None
            self.connected.set()
            self._settled.set()
            try:
                await self._serve(conn)
            finally:
                self._resent = False
                self._conn = None
                self.connected.clear()
                self.down_since = time.time()
                conn.close()
            if not self._closed:
                await asyncio.sleep(0.05)  # a dropped connection: again at once, then backoff

    async def _connect(self) -> tornado.websocket.WebSocketClientConnection:
        query = urlencode({"since": self._consumed, "writer": self._writer})
        request = upgrade_request(self.servers.url, self.path, self._token(), self.ca_cert, query)
        try:
            conn = await connect(request, MAX_MESSAGE + (1 << 20))
        except tornado.httpclient.HTTPClientError as exc:
            raise _refusal(exc) from None
        except (OSError, tornado.websocket.WebSocketError, TimeoutError) as exc:
            raise Unavailable(
                f"cannot open the stream to {self.servers.url}: {exc or type(exc).__name__}",
                hint="is the control plane running? the stream is opened again",
                code="server_unreachable",
            ) from None
        no_delay(conn)
        return conn

    def _token(self) -> str:
        return self.token() if callable(self.token) else self.token

    async def _serve(self, conn: tornado.websocket.WebSocketClientConnection) -> None:
        first = await conn.read_message()
        if not isinstance(first, bytes) or first[:1] != STATE:
            return
        self._said(decode_state(first))
        # What the server took of this writer is done; the rest goes again, in order.
        applied = int(self.status.get("applied", 0))
        self._acked_through(applied)
        # In order, with what ``send`` adds meanwhile (it writes itself once this is done).
        i = 0
        while i < len(self._unacked):
            seq, m = self._unacked[i]
            await conn.write_message(encode(seq, m), binary=True)
            i += 1
        self._resent = True
        self._acked = self._consumed
        while True:
            data = await conn.read_message()
            if data is None:
                return
            if not isinstance(data, bytes):
                continue
            kind = data[:1]
            if kind == MSG:
                seq, m = decode(data)
                if seq > self._got:
                    self._got = seq
                    self._inbox.append((seq, m))
                    self._news.set()
            elif kind == ACK:
                self._acked_through(decode_ack(data))
            elif kind == STATE:
                self._said(decode_state(data))

    def _said(self, status: dict[str, Any]) -> None:
        refused = status.pop("refused", None)
        if refused:
            # A message the server will never take (too large): dropped, not sent again.
            self._acked_through(int(refused.get("seq", 0)))
            log.warning("stream %s: %s", self.path, refused.get("message", "a message refused"))
        self.status.update(status)
        self._news.set()
        if self.on_status is not None:
            self.on_status(dict(self.status))

    def _acked_through(self, seq: int) -> None:
        while self._unacked and self._unacked[0][0] <= seq:
            self._unacked_bytes -= self._unacked.popleft()[1].size
        self._drained.set()

    def _fail(self, exc: GPUlayerError) -> None:
        self._error = exc
        self._settled.set()
        self._news.set()
        self._drained.set()


def upgrade_request(
    server_url: str, path: str, token: str, ca_cert: str | None, query: str = ""
) -> tornado.httpclient.HTTPRequest:
    """The WebSocket upgrade to ``path`` under a control plane's API (a kernel's stream, a
    worker's tunnel): the token in the header, never the URL; TLS as the HTTP wire's."""
    base = urlsplit(api_base(server_url))
    scheme = "wss" if base.scheme == "https" else "ws"
    return tornado.httpclient.HTTPRequest(
        urlunsplit((scheme, base.netloc, base.path + path, query, "")),
        headers={"Authorization": f"Bearer {token}", versions.HEADER: PROTOCOL},
        connect_timeout=CONNECT_TIMEOUT,
        request_timeout=CONNECT_TIMEOUT,
        ssl_options=client_verify(ca_cert) if scheme == "wss" else None,
    )


def no_delay(conn: tornado.websocket.WebSocketClientConnection) -> None:
    """Small messages one after another (a reply, then its status; a report, then a poll):
    without this, Nagle's algorithm holds the second until the first is acknowledged (up to
    40 ms on Linux)."""
    if conn.protocol is not None and conn.protocol.stream is not None:
        conn.protocol.stream.set_nodelay(True)


async def connect(
    request: tornado.httpclient.HTTPRequest, max_size: int
) -> tornado.websocket.WebSocketClientConnection:
    """Open a WebSocket (a kernel's stream, a tunnel), pinged every ``PING_EVERY`` seconds.

    Shielded: a close while the upgrade is under way must not orphan the connection tornado goes
    on opening (unclosed, it warns when collected, in whatever runs then): it is closed once made.
    """
    opening = asyncio.ensure_future(
        tornado.websocket.websocket_connect(
            request, max_message_size=max_size, ping_interval=PING_EVERY, ping_timeout=PING_EVERY
        )
    )
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[tornado.websocket.WebSocketClientConnection]) -> None:
    """Close a connection whose opener went away before it was made."""
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _write_soon(conn: tornado.websocket.WebSocketClientConnection, data: bytes) -> None:
    """Write without waiting (an acknowledgement); a closed connection drops it: the reconnect
    asks from the same cursor."""
    try:
        fut = conn.write_message(data, binary=True)
    except tornado.websocket.WebSocketClosedError:
        return
    fut.add_done_callback(lambda f: f.exception())


def _refusal(exc: tornado.httpclient.HTTPClientError) -> GPUlayerError:
    """The server's answer to the upgrade as the error it stands for."""
    body: Any = None
    response = exc.response
    if response is not None and response.body:
        with contextlib.suppress(ValueError):
            body = json.loads(response.body)
    if isinstance(body, dict) and "code" in body:
        err = from_json(exc.code, body)
        if exc.code == 404 and err.code == ErrorCode.NOT_FOUND:
            return StreamUnsupported("this control plane has no stream route")
        if err.code in MOVE_CODES:
            return Unavailable(err.message, hint=err.hint, code=err.code)
        return err
    if exc.code in (502, 503, 504):
        return Unavailable(f"the stream was refused: HTTP {exc.code}", code="server_unreachable")
    return StreamUnsupported(
        f"the stream was refused: HTTP {exc.code} (a proxy without WebSockets?)"
    )
