"""The GPU kernels' streams (ADR 0021; issues 33, 35): one WebSocket per side of a kernel's relay.

``GET /api/v1/kernels/{kernel}/stream`` (the Jupyter host, a client token with the user role) and
``GET /api/v1/worker/jobs/{job_id}/kernel/stream`` (the worker the kernel's session is placed on,
its session token) upgrade to a WebSocket that carries the kernel's messages both ways in binary
(``wire/kernels.py``). Each is the server end of ``wire/stream.py``'s protocol:

- on connect the server says the kernel's status and ``applied``, the last message it took from
  this writer (``?writer=``), then sends its lane's messages after ``?since=``;
- every message it takes goes into the kernel's lane (``controlplane/sessions/lanes.py``) and is
  acknowledged; while the lane is full the socket is not read (TCP pushes back on the sender); a
  message that can never fit is refused by a status message naming it, and dropped;
- the reader's acknowledgements free the lane; a status change (up, exited, ended) is sent as it
  happens, and an ended kernel's stream closes after saying why.

Authentication is the HTTP routes' (the token from the ``Authorization`` header, never the URL),
checked before the upgrade; a refusal is the usual JSON error with its status. The streams are
mounted by ``gpulayer serve`` and, for workers, by every host (``stream_handlers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import tornado.web
import tornado.websocket

from ..contracts.kernels import MAX_MESSAGE
from ..controlplane.sessions.kernels import KernelRelay, LiveKernel
from ..controlplane.sessions.lanes import Lane
from ..controlplane.signals import first_of
from ..errors import GPUlayerError, InvalidInput
from ..security import Role, TokenKind, check_role
from ..wire.kernels import (
    ACK,
    MSG,
    KernelMessage,
    KernelStatus,
    decode,
    decode_ack,
    encode,
    encode_ack,
    encode_state,
)
from .auth import bearer_of
from .context import ApiContext
from .errors import error_answer
from .longpoll import shutting_down
from .params import route_pattern
from .tunnel import ClientTunnel, Tunnel, WorkerTunnel  # streams too: closed with them

log = logging.getLogger("gpulayer.api")


class _KernelStream(tornado.websocket.WebSocketHandler):
    """What both sides' streams share: the handshake, the two pumps, the refusals."""

    route = ""
    side = ""  # "host" or "worker"

    def initialize(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.relay: KernelRelay = ctx.cp.kernels
        self.kernel: LiveKernel | None = None
        self.inbound: Lane | None = None  # the lane this side writes
        self.outbound: Lane | None = None  # the lane this side reads
        self._since = 0
        self._pump: asyncio.Task[None] | None = None
        self._ack = 0
        self._acking = False

    def check_origin(self, origin: str) -> bool:
        """Bearer tokens only, never cookies: another site's page cannot ride a session."""
        return True

    def get_compression_options(self) -> None:
        return None  # kernel messages are mostly small; images are compressed already

    @property
    def max_message_size(self) -> int:
        return MAX_MESSAGE + (1 << 20)

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            if self.ctx.stopping.is_set():
                raise shutting_down()
            for values in self.request.query_arguments.values():
                if any(v.startswith(b"glt_") for v in values):
                    raise InvalidInput(
                        "tokens are never accepted in URLs (they would end up in logs)",
                        hint="send the token as the header 'Authorization: Bearer <token>'",
                        code="token_in_url",
                    )
            await self.authorize(**kwargs)
            self._since = int(self.get_query_argument("since", "0") or 0)
        except (GPUlayerError, ValueError) as exc:
            self._refuse(exc)
            return
        await super().get(*args, **kwargs)

    async def authorize(self, **path: str) -> None:
        raise NotImplementedError

    def _refuse(self, exc: BaseException) -> None:
        status, body = error_answer(exc, 400)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    # -- the connection ---------------------------------------------------------------------------

    def open(self, *args: str, **kwargs: str) -> None:
        assert self.kernel is not None and self.inbound is not None
        writer = self.get_query_argument("writer", "")
        if writer != self.inbound.writer:  # a new writer numbers from 1 again
            self.inbound.writer, self.inbound.applied = writer, 0
        self.set_nodelay(True)
        self.ctx.streams.add(self)
        self._pump = asyncio.ensure_future(self._send_out())

    def on_close(self) -> None:
        self.ctx.streams.discard(self)
        if self._pump is not None:
            self._pump.cancel()

    async def _send_out(self) -> None:
        """The outbound lane's messages and the kernel's status changes, as they come."""
        k, lane = self.kernel, self.outbound
        assert k is not None and lane is not None and self.inbound is not None
        sent = self._since
        lane.ack(sent)
        said: KernelStatus | None = None
        try:
            await self.write_message(
                encode_state({"applied": self.inbound.applied, **self._status().as_json()}),
                binary=True,
            )
            while True:
                wrote = False
                status = self._status()
                if status != said:
                    if said is not None:
                        await self.write_message(encode_state(status.as_json()), binary=True)
                        wrote = True
                    said = status
                for seq, m in lane.after(sent):
                    await self.write_message(encode(seq, m), binary=True)
                    sent, wrote = seq, True
                if wrote:
                    continue  # what came while writing is sent before any wait
                if status.state == "ended":
                    self.close(1000, "the kernel ended")
                    return
                await first_of(self.relay.clock, None, lane.signal, k.changed)
        except tornado.websocket.WebSocketClosedError:
            return

    def _status(self) -> KernelStatus:
        assert self.kernel is not None
        return self.relay.status(self.kernel)

    async def on_message(self, message: str | bytes) -> None:
        if not isinstance(message, bytes):
            return
        kind = message[:1]
        try:
            if kind == MSG:
                await self._take(*decode(message))
            elif kind == ACK and self.outbound is not None:
                self.outbound.ack(decode_ack(message))
        except ValueError as exc:
            log.info("kernel stream %s: %s; closing", self.request.path, exc)
            self.close(1003, str(exc)[:100])

    async def _take(self, seq: int, m: KernelMessage) -> None:
        lane = self.inbound
        assert lane is not None and self.kernel is not None
        if seq <= lane.applied:
            self._acknowledge(seq)  # sent again after a reconnect: taken already
            return
        try:
            self.check(m)
        except GPUlayerError as exc:
            lane.applied = seq
            refused = {"seq": seq, **exc.to_json()}
            await self.write_message(encode_state({"refused": refused}), binary=True)
            return
        # The socket is not read while the lane is full: the sender's TCP window closes.
        while not lane.room_for(m.size):
            self.make_room(m)
            if lane.room_for(m.size):
                break
            await first_of(self.relay.clock, None, lane.drained, self.kernel.changed)
        lane.put([m])
        lane.applied = seq
        self.taken(m)
        self._acknowledge(seq)

    def check(self, m: KernelMessage) -> None:
        raise NotImplementedError

    def make_room(self, m: KernelMessage) -> None:
        """What a side may do before it waits for room (the up lane sheds old iopub)."""

    def taken(self, m: KernelMessage) -> None:
        raise NotImplementedError

    def _acknowledge(self, seq: int) -> None:
        """Acknowledge ``seq`` soon: a burst of messages gets one acknowledgement."""
        self._ack = max(self._ack, seq)
        if not self._acking:
            self._acking = True
            asyncio.get_running_loop().call_soon(self._send_ack)

    def _send_ack(self) -> None:
        self._acking = False
        with contextlib.suppress(tornado.websocket.WebSocketClosedError):
            fut = self.write_message(encode_ack(self._ack), binary=True)
            fut.add_done_callback(lambda f: f.exception())


class KernelHostStream(_KernelStream):
    """The Jupyter host's end: it writes the down lane and reads the up lane."""

    route = "/kernels/{kernel}/stream"
    side = "host"

    async def authorize(self, **path: str) -> None:
        principal = await self.ctx.tokens.authenticate(bearer_of(self.request), (TokenKind.CLIENT,))
        who = principal.identity
        check_role(who, Role.USER, "drive a GPU kernel")
        self.kernel = self.relay.acting(path["kernel"], who)
        self.inbound, self.outbound = self.kernel.down, self.kernel.up

    def check(self, m: KernelMessage) -> None:
        assert self.kernel is not None
        self.relay.check_down(self.kernel, [m])

    def make_room(self, m: KernelMessage) -> None:
        assert self.kernel is not None and self.inbound is not None
        self.inbound.limit = self.relay.down_limit(self.kernel)  # the kernel came up meanwhile

    def taken(self, m: KernelMessage) -> None:
        assert self.kernel is not None
        self.relay.sent_down(self.kernel, [m])


class KernelWorkerStream(_KernelStream):
    """The worker's end: it writes the up lane and reads the down lane."""

    route = "/worker/jobs/{job_id}/kernel/stream"
    side = "worker"

    async def authorize(self, **path: str) -> None:
        principal = await self.ctx.tokens.authenticate(bearer_of(self.request), (TokenKind.WORKER,))
        assert principal.worker_id is not None
        self.kernel = self.relay.worker_kernel(path["job_id"], principal.worker_id)
        self.inbound, self.outbound = self.kernel.up, self.kernel.down

    def check(self, m: KernelMessage) -> None:
        assert self.inbound is not None
        self.inbound.check(m, "the relay")

    def make_room(self, m: KernelMessage) -> None:
        assert self.inbound is not None
        self.inbound.shed(m.size)

    def taken(self, m: KernelMessage) -> None:
        assert self.kernel is not None
        self.relay.sent_up(self.kernel, [m])


STREAMS: tuple[type[_KernelStream], ...] = (KernelHostStream, KernelWorkerStream)


def stream_handlers(
    prefix: str, ctx: ApiContext, *, host: bool
) -> list[tuple[str, type[tornado.web.RequestHandler], dict[str, Any]]]:
    """The stream routes a host mounts: the worker's (its kernels' streams and its tunnel,
    ``tunnel.py``) always, the Jupyter host's and the clients' tunnel with ``host`` (``gpulayer
    serve``: inside Jupyter the provisioner reaches its control plane in-process, and the user
    routes answer to Jupyter's own login, which a tunnel's bearer check is not)."""
    mounted = STREAMS if host else (KernelWorkerStream,)
    tunnels: tuple[type[Tunnel], ...] = (WorkerTunnel, ClientTunnel) if host else (WorkerTunnel,)
    return [(route_pattern(prefix, h.route), h, {"ctx": ctx}) for h in mounted] + [
        (route_pattern(prefix, t.route), t, {"ctx": ctx, "prefix": prefix}) for t in tunnels
    ]


async def close_streams(ctx: ApiContext) -> None:
    """The host stops: close every stream (their clients reconnect, to a standby perhaps)."""
    for s in list(ctx.streams):
        s.close(1001, "the server is stopping")
