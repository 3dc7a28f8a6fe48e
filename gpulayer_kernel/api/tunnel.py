"""The tunnels (issue 35): a caller's repeated small requests on one kept-open WebSocket.

A worker asks the control plane the same few things over and over: its next work (a long-poll),
its reports, its session cells; a client (a notebook's kernel, the Jupyter host's proxy, a
script) runs cells, follows jobs and polls. Over HTTP each is a request of its own, and each costs
both sides the framing, a wake-up per hop and, on the caller, the HTTP client's own work: ~0.7 ms
of CPU and ~0.6 ms of wall time a request on loopback, measured against ~0.13 ms and ~0.2 ms for
the same exchange on a WebSocket. Two routes upgrade to a WebSocket that carries such requests
and their answers: ``GET /api/v1/worker/tunnel`` (:class:`WorkerTunnel`: a worker's session
token; worker routes) and ``GET /api/v1/tunnel`` (:class:`ClientTunnel`: a client or job token;
every other JSON route).

**It is HTTP without the framing, not a second API.** Each request on a tunnel is run by the
same application as over HTTP: the same route, handler, authentication (its own
``Authorization`` header, checked as on any request: the upgrade's check only keeps anonymous
callers out), limits, idempotency and answer. A long-poll that the tunnel's close cuts off is told
so as an HTTP one is (``on_connection_close``: a worker is suspected). Answers go back as they
come, in any order: a long-poll does not hold up a report. A request its caller stops waiting
for is said so (``{"i": n, "x": true}``), and its handler hears a closed connection, as it does
when an HTTP client gives up (a stopping worker's long-poll: nothing more is placed on it).

What a tunnel takes: its side's routes, each request's body whole in its message (bundles',
artifacts' and workspaces' bytes go over HTTP). Anything else, or a request past ``MAX_OPEN``
open ones, or one whose answer is larger than a message may be (``MAX_BODY``: the answer is
dropped as it is written, never held), is answered 421 ``not_over_tunnel``, and the caller
sends it again over HTTP (it sends the routes of bytes over HTTP from the start).

The messages are ``wire/tunnel_frames.py``'s; ``wire/tunnel.py`` is the caller's end.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import tornado.httputil
import tornado.web
import tornado.websocket
from tornado.concurrent import Future

from ..contracts.limits import MAX_BODY
from ..errors import GPUlayerError, InvalidInput
from ..security import TokenKind
from ..wire.tunnel_frames import HEADROOM, MISDIRECTED, pack, unpack
from .auth import bearer_of
from .context import ApiContext
from .errors import error_answer
from .longpoll import shutting_down

log = logging.getLogger("gpulayer.api")

MAX_OPEN = 256  # requests open on one tunnel at once (a worker has a long-poll and a few reports)
STREAM_SUFFIX = "/stream"  # the kernels' WebSocket routes: upgrades, never a tunnel's requests


def _done() -> Future[None]:
    f: Future[None] = Future()
    f.set_result(None)
    return f


class _Exchange(tornado.httputil.HTTPConnection):
    """One request's connection as its handler sees it: the answer is collected, then sent back
    on the tunnel as one message."""

    def __init__(self, tunnel: Tunnel, ident: int) -> None:
        self.tunnel = tunnel
        self.ident = ident
        # The caller's address, for the logs and the handlers, as on its own connection.
        self.context = getattr(tunnel.request.connection, "context", None)
        self.status = 500
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0  # bytes of the answer so far; past MAX_BODY it is dropped, not kept
        self._on_close: Any = None

    def set_close_callback(self, callback: Any) -> None:
        self._on_close = callback

    def write_headers(
        self,
        start_line: tornado.httputil.RequestStartLine | tornado.httputil.ResponseStartLine,
        headers: tornado.httputil.HTTPHeaders,
        chunk: bytes | None = None,
    ) -> Future[None]:
        assert isinstance(start_line, tornado.httputil.ResponseStartLine)
        self.status = start_line.code
        self.headers = {k: v for k, v in headers.get_all() if k != "Content-Length"}
        return self.write(chunk or b"")

    def write(self, chunk: bytes) -> Future[None]:
        self.size += len(chunk)
        if self.size <= MAX_BODY:
            self.chunks.append(chunk)
        else:
            self.chunks.clear()  # an answer too large for one message (a blob): HTTP's
        return _done()

    def finish(self) -> None:
        if self.size > MAX_BODY:
            self.tunnel.refuse(self, f"the answer is larger than the {self.tunnel.what} takes")
        else:
            self.tunnel.answer(self, b"".join(self.chunks))

    def closed(self) -> None:
        """The tunnel closed before the answer: the handler hears it as a closed connection."""
        callback, self._on_close = self._on_close, None
        if callback is not None:
            callback()


class Tunnel(tornado.websocket.WebSocketHandler):
    """The control plane's end of a tunnel (see the module docstring); its two kinds say who
    may open one (``kinds``) and which routes it takes (``takes``)."""

    route = ""
    what = ""  # "worker tunnel": its name in refusals and logs
    kinds: tuple[TokenKind, ...] = ()

    def initialize(self, ctx: ApiContext, prefix: str) -> None:
        self.ctx = ctx
        self.prefix = prefix.rstrip("/")  # "/api/v1": the routes it takes are under it
        self.exchanges: dict[int, _Exchange] = {}
        self._running: set[asyncio.Future[None]] = set()
        self.answered = 0  # requests answered on it (for diagnostics and tests)

    def check_origin(self, origin: str) -> bool:
        """Bearer tokens only, never cookies: another site's page cannot ride a session."""
        return True

    def get_compression_options(self) -> None:
        return None  # small JSON, mostly: compressing costs more than it saves on a LAN

    @property
    def max_message_size(self) -> int:
        return MAX_BODY + HEADROOM

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            if self.ctx.stopping.is_set():
                raise shutting_down()
            await self.ctx.tokens.authenticate(bearer_of(self.request), self.kinds)
        except GPUlayerError as exc:
            status, body = error_answer(exc, 400)
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body))
            return
        await super().get(*args, **kwargs)

    def open(self, *args: str, **kwargs: str) -> None:
        self.set_nodelay(True)  # an answer is one small message: never held for an ACK
        self.ctx.streams.add(self)

    def on_close(self) -> None:
        self.ctx.streams.discard(self)
        exchanges, self.exchanges = self.exchanges, {}
        for exchange in exchanges.values():
            exchange.closed()

    def on_message(self, message: str | bytes) -> None:
        if not isinstance(message, bytes):
            return
        try:
            header, body = unpack(message)
            ident = int(header["i"])
            if header.get("x"):  # its sender gave up waiting: as if its connection closed
                self._abandoned(ident)
                return
            method, uri = str(header["m"]), str(header["u"])
            headers = tornado.httputil.HTTPHeaders(
                {str(k): str(v) for k, v in dict(header.get("h") or {}).items()}
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.info("%s from %s: %s; closing", self.what, self.request.remote_ip, exc)
            self.close(1003, "not a tunnel message")
            return
        exchange = _Exchange(self, ident)
        self.exchanges[ident] = exchange
        headers["Host"] = self.request.host  # the tunnel's: the worker reached this host
        start = tornado.httputil.RequestStartLine(method, uri, "HTTP/1.1")
        request = tornado.httputil.HTTPServerRequest(
            start_line=start, headers=headers, connection=exchange
        )
        if not self.takes(request.path) or request.path == self.prefix + self.route:
            self.refuse(exchange, f"{request.path} is not taken over the {self.what}")
            return
        if len(self.exchanges) > MAX_OPEN:
            self.refuse(exchange, f"the {self.what} has {MAX_OPEN} requests open")
            return
        # A task each: a long-poll must not hold up the messages behind it.
        task = asyncio.ensure_future(self._run(exchange, start, request, body))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(
        self,
        exchange: _Exchange,
        start: tornado.httputil.RequestStartLine,
        request: tornado.httputil.HTTPServerRequest,
        body: bytes,
    ) -> None:
        """Hand the request to the application as an HTTP connection does: its start line and
        headers, its body, its end (the handlers read their bodies as they arrive)."""
        try:
            delegate = self.application.find_handler(request)
            ready = delegate.headers_received(start, request.headers)
            if ready is not None:
                await ready
            if body:
                taken = delegate.data_received(body)
                if taken is not None:
                    await taken
            delegate.finish()
        except Exception:  # the handlers answer their own errors: this is a bug of ours
            log.exception("%s: %s %s failed", self.what, request.method, request.path)
            exchange.status, exchange.headers, exchange.chunks = 500, {}, []
            exchange.finish()

    def _abandoned(self, ident: int) -> None:
        """A request its worker stopped waiting for (a long-poll of a worker that stops): its
        handler hears a closed connection, as over HTTP, and its answer is not sent."""
        exchange = self.exchanges.pop(ident, None)
        if exchange is not None:
            exchange.closed()

    def takes(self, path: str) -> bool:
        """Whether a request for ``path`` is run on this tunnel (not the tunnel itself, ever)."""
        raise NotImplementedError

    def refuse(self, exchange: _Exchange, why: str) -> None:
        """421 (``MISDIRECTED``): the worker's end sends the request again over HTTP."""
        err = InvalidInput(
            why, hint="send it over HTTP (the worker does so by itself)", code="not_over_tunnel"
        )
        exchange.status = MISDIRECTED
        exchange.headers = {"Content-Type": "application/json"}
        self.answer(exchange, json.dumps(err.to_json()).encode())

    def answer(self, exchange: _Exchange, body: bytes) -> None:
        """Send an exchange's answer back (dropped if the tunnel closed meanwhile)."""
        if self.exchanges.pop(exchange.ident, None) is None:
            return
        self.answered += 1
        message = pack({"i": exchange.ident, "s": exchange.status, "h": exchange.headers}, body)
        try:
            fut = self.write_message(message, binary=True)
        except tornado.websocket.WebSocketClosedError:
            return
        fut.add_done_callback(lambda f: f.exception())


class WorkerTunnel(Tunnel):
    """A worker's tunnel: its session token opens it; the worker routes."""

    route = "/worker/tunnel"
    what = "worker tunnel"
    kinds = (TokenKind.WORKER,)

    def takes(self, path: str) -> bool:
        return path.startswith(self.prefix + "/worker/")


class ClientTunnel(Tunnel):
    """A client's tunnel: a client or job token opens it; the API's other routes (a stream is
    an upgrade of its own, never a tunnel's request)."""

    route = "/tunnel"
    what = "client tunnel"
    kinds = (TokenKind.CLIENT, TokenKind.JOB)

    def takes(self, path: str) -> bool:
        return (
            path.startswith(self.prefix + "/")
            and not path.startswith(self.prefix + "/worker/")
            and not path.endswith(STREAM_SUFFIX)
        )
