"""The Jupyter host's end of a GPU kernel's relay: the connection file's ports, bound here.

Jupyter's clients (the server's websocket channels, a ``KernelClient``) connect to the ports of
the kernel's connection file as they would to a local kernel. :class:`LocalRelay` binds them
(ROUTER for shell, control and stdin, PUB for iopub, an echoing REP for the heartbeat) on the host
loop and moves raw multipart messages to and from the control plane: up with one request per
batch (what arrives while a request is in flight goes with the next), down with a long-poll. A
ROUTER puts the client's identity in front of each message; it travels with the message, the
worker's DEALER sends it on, the kernel's reply carries it back and this ROUTER routes on it.

It also tells its provisioner what only the control plane knows: the kernel's process exited
(``exit_code``), or its session ended (``died``: a lost worker, the idle timeout, a stop). When the
session ends under a running cell, the cell is answered here with the reason, signed with the
connection's key (with the workspace's notes, the only messages the relay makes): "kernel
died: worker w1 was lost ...".
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import zmq
import zmq.asyncio

from ..contracts.kernels import Channel, KernelFrame
from ..errors import GPUlayerError, NotFound
from .link import HostLink

log = logging.getLogger("gpulayer.kernels")

LONG_POLL = 25.0  # seconds one up long-poll waits; the control plane answers at once on news
DELIM = b"<IDS|MSG>"
ROUTED: tuple[Channel, ...] = ("shell", "control", "stdin")
BIND = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER, "iopub": zmq.PUB}


class LocalRelay:
    """One kernel's bound ports on the Jupyter host and its two pumps (on the host loop)."""

    def __init__(
        self,
        link: HostLink,
        kernel_id: str,
        connection: dict[str, Any],
        *,
        on_lost_key: Any = None,
    ) -> None:
        self.link = link
        self.kernel_id = kernel_id
        self.conn = connection
        self.on_lost_key = on_lost_key  # async () -> None: re-attach after a server restart
        self.ctx = zmq.asyncio.Context()
        self.socks: dict[str, zmq.asyncio.Socket] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self._outbox: list[KernelFrame] = []
        self._has_out = asyncio.Event()
        self._since = 0
        self.state = "waiting"
        self.generation = 0
        self.exit_code: int | None = None
        self.died: str | None = None
        self.changed = asyncio.Event()
        self._pending: dict[str, tuple[list[bytes], dict[str, Any]]] = {}  # execute requests
        # The workspace's hooks (ADR 0022, ``workspace/kernel.py``): awaited before each
        # execute_request goes on (its changed files reach the worker first); called after each
        # execute_reply (outputs come back), its text shown in that cell.
        self.workspace: Any = None

    def start(self) -> None:
        ip = self.conn.get("ip", "127.0.0.1")
        for channel, kind in BIND.items():
            s = self.ctx.socket(kind)
            s.linger = 0
            if kind == zmq.ROUTER:
                s.router_handover = 1  # a client reconnecting with its identity takes it back
            s.bind(f"tcp://{ip}:{self.conn[f'{channel}_port']}")
            self.socks[channel] = s
        hb = self.ctx.socket(zmq.REP)
        hb.linger = 0
        hb.bind(f"tcp://{ip}:{self.conn['hb_port']}")
        self.socks["hb"] = hb
        self.tasks = [asyncio.ensure_future(self._read(ch)) for ch in ROUTED] + [
            asyncio.ensure_future(self._heartbeat(hb)),
            asyncio.ensure_future(self._up()),
            asyncio.ensure_future(self._down()),
        ]

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for s in self.socks.values():
            s.close(linger=0)
        self.ctx.term()

    def restarted(self, generation: int) -> None:
        """A new kernel process is asked for: the old one's exit is history."""
        self.generation = generation
        self.exit_code = None
        self.state = "waiting"

    # -- Jupyter's clients -> the kernel -----------------------------------------------------------

    async def _read(self, channel: Channel) -> None:
        sock = self.socks[channel]
        while True:
            parts = await sock.recv_multipart()
            if channel == "shell" and self._remember(parts) and self.workspace is not None:
                await self.workspace.before_execute()
            enc = [base64.b64encode(p).decode() for p in parts]
            self._outbox.append(KernelFrame.model_construct(channel=channel, parts=enc))
            self._has_out.set()

    async def _heartbeat(self, sock: zmq.asyncio.Socket) -> None:
        # Answered here: the kernel's liveness is its session's, which the relay reports.
        while True:
            await sock.send(await sock.recv())

    async def _up(self) -> None:
        tries = 0
        while True:
            await self._has_out.wait()
            self._has_out.clear()
            batch, self._outbox = self._outbox, []
            while batch:
                try:
                    await self.link.send(self.kernel_id, batch)
                    tries = 0
                    break
                except asyncio.CancelledError:
                    raise
                except NotFound as exc:
                    if exc.code == "kernel_not_found" and self.on_lost_key is not None:
                        await self._reattach()
                        continue
                    log.warning("kernel %s: %s", self.kernel_id, exc.message)
                    break
                except Exception as exc:
                    log.info("kernel %s: sending failed (%s); retrying", self.kernel_id, exc)
                    await asyncio.sleep(min(5.0, 0.1 * 2**tries))  # retry backoff
                    tries += 1

    # -- the kernel -> Jupyter's clients -----------------------------------------------------------

    async def _down(self) -> None:
        tries = 0
        while True:
            try:
                page = await self.link.receive(self.kernel_id, self._since, LONG_POLL)
                tries = 0
            except asyncio.CancelledError:
                raise
            except NotFound as exc:
                if exc.code == "kernel_not_found" and self.on_lost_key is not None:
                    await self._reattach()
                    continue
                self._end(f"kernel died: {exc.message}")
                return
            except GPUlayerError as exc:
                log.info("kernel %s: relay unreachable (%s); retrying", self.kernel_id, exc)
                await asyncio.sleep(min(5.0, 0.1 * 2**tries))  # retry backoff
                tries += 1
                continue
            self._since = page.next_since
            for f in page.frames:
                parts = [base64.b64decode(p) for p in f.parts]
                if f.channel == "shell":
                    self._answered(parts)
                await self.socks[f.channel].send_multipart(parts)
                if f.channel == "shell" and self.workspace is not None:
                    self._after_execute(parts)
            if page.state == "ended":
                self._end(page.reason or "kernel died: its session ended")
                return
            if page.state == "exited" and page.generation >= self.generation:
                if self.exit_code is None:
                    self.exit_code = 1
                    self.changed.set()
            if page.state != self.state:
                self.state = page.state
                self.changed.set()
            # An in-process link may answer without suspending: let the loop's others run.
            await asyncio.sleep(0)

    async def _reattach(self) -> None:
        assert self.on_lost_key is not None
        tries = 0
        while True:
            try:
                await self.on_lost_key()
                log.warning("kernel %s: re-attached to a restarted control plane", self.kernel_id)
                return
            except asyncio.CancelledError:
                raise
            except NotFound as exc:
                self._end(f"kernel died: {exc.message}")
                raise asyncio.CancelledError from None
            except Exception as exc:
                log.info("kernel %s: re-attaching failed (%s)", self.kernel_id, exc)
                await asyncio.sleep(min(5.0, 0.2 * 2**tries))  # retry backoff
                tries += 1

    def _end(self, why: str) -> None:
        """The session is over: answer the cells still waiting with the reason, once."""
        if self.died is not None:
            return
        self.died = why
        self.state = "ended"
        log.error("kernel %s: %s", self.kernel_id, why)
        for ident, header in list(self._pending.values()):
            self._tell(ident, header, why)
        self._pending.clear()
        self.changed.set()

    # -- the cells in flight (to answer them if the kernel dies under them) ----------------------

    def _remember(self, parts: list[bytes]) -> bool:
        """Keep an execute request (True) until its reply comes."""
        header = _header(parts)
        if header is not None and header.get("msg_type") == "execute_request":
            i = parts.index(DELIM)
            self._pending[str(header.get("msg_id"))] = (parts[:i], header)
            return True
        return False

    def _after_execute(self, parts: list[bytes]) -> None:
        header, parent = _header(parts), _part(parts, 3)
        if header is None or parent is None or header.get("msg_type") != "execute_reply":
            return

        async def after() -> None:
            text = await self.workspace.after_execute()
            if text and self.died is None:
                self._stream(parent, text)

        self.tasks.append(asyncio.ensure_future(after()))
        self.tasks = [t for t in self.tasks if not t.done()]

    def _answered(self, parts: list[bytes]) -> None:
        parent = _part(parts, 3)
        if parent is not None:
            self._pending.pop(str(parent.get("msg_id")), None)

    def _signer(self) -> Any:
        from jupyter_client.session import Session

        key = self.conn.get("key", b"")
        return Session(
            key=key if isinstance(key, bytes) else str(key).encode(),
            signature_scheme=self.conn.get("signature_scheme", "hmac-sha256"),
            username="gpulayer",
        )

    def _stream(self, parent: dict[str, Any], text: str) -> None:
        """A line of the relay's own in the cell's output (the workspace's notes)."""
        content = {"name": "stderr", "text": text}
        self._signer().send(self.socks["iopub"], "stream", content, parent=parent)

    def _tell(self, ident: list[bytes], parent: dict[str, Any], why: str) -> None:
        session = self._signer()
        iopub, shell = self.socks["iopub"], self.socks["shell"]
        error = {"ename": "KernelDied", "evalue": why, "traceback": [why]}
        session.send(iopub, "error", error, parent=parent)
        session.send(iopub, "status", {"execution_state": "idle"}, parent=parent)
        reply = {"status": "error", "execution_count": None, **error}
        session.send(shell, "execute_reply", reply, parent=parent, ident=ident)


def _part(parts: list[bytes], offset: int) -> dict[str, Any] | None:
    import json

    try:
        value = json.loads(parts[parts.index(DELIM) + offset])
    except (ValueError, IndexError):
        return None
    return value if isinstance(value, dict) else None


def _header(parts: list[bytes]) -> dict[str, Any] | None:
    return _part(parts, 2)
