"""The Jupyter host's end of a GPU kernel's relay: the connection file's ports, bound here.

Jupyter's clients (the server's websocket channels, a ``KernelClient``) connect to the ports of
the kernel's connection file as they would to a local kernel. :class:`Ports` binds them (ROUTER
for shell, control and stdin, PUB for iopub, an echoing REP for the heartbeat) before the file is
written; :class:`LocalRelay` moves raw multipart messages between them and the control plane on
the host loop: up with one request per batch (what arrives while a request is in flight goes
with the next), down with a long-poll. A ROUTER puts the client's identity in front of each
message; it travels with the message, the worker's DEALER sends it on, the kernel's reply carries
it back and this ROUTER routes on it.

A full lane (the control plane holds what the kernel has not read yet) is waited out; a message
the relay refuses for its size never blocks the rest: it is dropped, and an execute request among
them is answered here with the reason. While the control plane cannot be reached, a running cell
is told so once ("output will resume"): the messages wait on both sides and come when it is back.

It also tells its provisioner what only the control plane knows: the kernel's process exited
(``exit_code``), or its session ended. A session that *died* (``died``: a lost worker) is a dead
kernel, which Jupyter's restarter starts again as a new session. A session ended on purpose
(``final``: it idled out, or someone stopped it; the control plane says so in the kernel's
status) stays ended: the relay keeps the kernel's ports and answers every request itself, an
execute request with the reason and how to get a GPU again ("this GPU kernel's session ended:
idle for 30 min ...; restart the kernel (Kernel ▸ Restart) to get a GPU again"), until the user
restarts the kernel (a new session) or shuts it down. When the session ends under a running
cell, the cell is answered with the reason. These answers, and the workspace's notes, are
signed with the connection's key: the only messages the relay makes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from ..codes import ErrorCode
from ..contracts.kernels import Channel
from ..errors import GPUlayerError, NotFound, TooLarge
from ..wire.kernels import DELIM, KernelMessage, part
from ..wire.outbox import Outbox
from .link import HostLink

log = logging.getLogger("gpulayer.kernels")

LONG_POLL = 2.0  # seconds one read of the up lane waits (on a stream: a local wait, no request)
OUTAGE_NOTICE = 3.0  # seconds unreachable before a running cell is told
ROUTED: tuple[Channel, ...] = ("shell", "control", "stdin")
BIND = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER, "iopub": zmq.PUB}


class Ports:
    """A kernel's connection-file ports, bound on the host loop before the file is written.

    jupyter_client picks free ports and writes them; a local kernel binds them at once. A GPU
    kernel's relay could bind only once its session is placed, seconds later, and meanwhile
    another process could take a port (``Address already in use``). So the ports are bound
    first, and the file names what is bound. They stay bound for the provisioner's life: a relay
    that ends and the next one (a restarted kernel) serve the same ports, and Jupyter's clients
    stay connected.
    """

    def __init__(self, ip: str, wanted: dict[str, Any]) -> None:
        """Bind each channel's port: the one in ``wanted`` (``shell_port`` ...) where set (a
        connection file written before), else one the system picks."""
        self.ctx = zmq.asyncio.Context()
        self.socks: dict[str, zmq.asyncio.Socket] = {}
        self.numbers: dict[str, int] = {}
        try:
            for channel, kind in {**BIND, "hb": zmq.REP}.items():
                s = self.ctx.socket(kind)
                s.linger = 0
                if kind == zmq.ROUTER:
                    s.router_handover = 1  # a client reconnecting with its identity takes it back
                self.socks[channel] = s
                port = int(wanted.get(f"{channel}_port") or 0)
                if port:
                    s.bind(f"tcp://{ip}:{port}")
                else:
                    port = s.bind_to_random_port(f"tcp://{ip}")
                self.numbers[f"{channel}_port"] = port
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for s in self.socks.values():
            s.close(linger=0)
        self.ctx.term()


class LocalRelay:
    """One kernel's two pumps between its bound :class:`Ports` and the control plane (on the
    host loop)."""

    def __init__(
        self,
        link: HostLink,
        kernel_id: str,
        connection: dict[str, Any],
        ports: Ports,
        *,
        on_lost_key: Any = None,
    ) -> None:
        self.link = link
        self.kernel_id = kernel_id
        self.conn = connection
        self.on_lost_key = on_lost_key  # async () -> None: re-attach after a server restart
        self.socks = ports.socks
        self.tasks: list[asyncio.Task[Any]] = []
        self.outbox = Outbox(
            lambda batch: self.link.send(self.kernel_id, batch),
            f"kernel {kernel_id}",
            refused=self._refused,
            lost=self._lost,
        )
        self._told_outage: float | None = None
        self._since = 0
        self.state = "waiting"
        self.generation = 0
        self.exit_code: int | None = None
        self.died: str | None = None
        self.final: str | None = None  # why its session ended on purpose (then it answers)
        self.changed = asyncio.Event()
        self._pending: dict[str, tuple[list[bytes], dict[str, Any]]] = {}  # execute requests
        # The workspace's hooks (ADR 0022, ``workspace/kernel.py``): awaited before each
        # execute_request goes on (its changed files reach the worker first); called after each
        # execute_reply (outputs come back), its text shown in that cell.
        self.workspace: Any = None
        self._signer: Any = None

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._read(ch)) for ch in ROUTED] + [
            asyncio.ensure_future(self._heartbeat(self.socks["hb"])),
            asyncio.ensure_future(self.outbox.run()),
            asyncio.ensure_future(self._down()),
        ]

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def restarted(self, generation: int) -> None:
        """A new kernel process is asked for: the old one's exit is history."""
        self.generation = generation
        self.exit_code = None
        self.state = "waiting"

    # -- Jupyter's clients -> the kernel -----------------------------------------------------------

    async def _read(self, channel: Channel) -> None:
        sock = self.socks[channel]
        while True:
            await self.outbox.room()  # the lane is full: ZMQ queues meanwhile
            parts = await sock.recv_multipart()
            if self.final is not None:
                self._answer_ended(channel, parts)
                continue
            if channel == "shell" and self._remember(parts) and self.workspace is not None:
                await self.workspace.before_execute()
            self.outbox.put(KernelMessage(channel, parts))

    async def _heartbeat(self, sock: zmq.asyncio.Socket) -> None:
        # Answered here: the kernel's liveness is its session's, which the relay reports.
        while True:
            await sock.send(await sock.recv())

    def _refused(self, m: KernelMessage, exc: TooLarge) -> None:
        """A message the relay will never take: its cell is answered with why."""
        header = m.header()
        if m.channel == "shell" and header and header.get("msg_type") == "execute_request":
            self._pending.pop(str(header.get("msg_id")), None)
            self._tell(m.idents(), header, f"{exc.message} ({exc.hint})")

    async def _lost(self, exc: NotFound) -> bool:
        """A restarted control plane forgot the kernel: re-attach, then send again."""
        if exc.code != ErrorCode.KERNEL_NOT_FOUND or self.on_lost_key is None:
            return False
        await self._reattach()
        return True

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
                if exc.code == ErrorCode.KERNEL_NOT_FOUND and self.on_lost_key is not None:
                    await self._reattach()
                    continue
                self._end(f"kernel died: {exc.message}")
                return
            except GPUlayerError as exc:
                log.info("kernel %s: relay unreachable (%s); retrying", self.kernel_id, exc)
                self._outage(time.time() - min(5.0, 0.1 * 2**tries))
                await asyncio.sleep(min(5.0, 0.1 * 2**tries))  # retry backoff
                tries += 1
                continue
            self._outage(self.link.outage(self.kernel_id))
            self._since = page.next_since
            for m in page.messages:
                if m.channel == "shell":
                    self._answered(m.parts)
                await self.socks[m.channel].send_multipart(m.parts)
                if m.channel == "shell" and self.workspace is not None:
                    self._after_execute(m)
            status = page.status
            if status.state == "ended":
                self._end(status.reason or "kernel died: its session ended", final=status.final)
                return
            if status.state == "exited" and status.generation >= self.generation:
                if self.exit_code is None:
                    self.exit_code = 1
                    self.changed.set()
            if status.state != self.state:
                self.state = status.state
                self.changed.set()
            # An in-process link may answer without suspending: let the loop's others run.
            await asyncio.sleep(0)

    def _outage(self, since: float | None) -> None:
        """Tell the running cells once per outage that the control plane is away."""
        if since is None:
            self._told_outage = None
            return
        if self._told_outage is not None or time.time() - since < OUTAGE_NOTICE:
            return
        self._told_outage = since
        when = time.strftime("%H:%M:%S", time.localtime(since))
        for ident, header in list(self._pending.values()):
            text = (
                f"[gpulayer] the control plane is unreachable since {when}; "
                "output will resume when it is back\n"
            )
            self._say(ident, header, "stream", {"name": "stderr", "text": text})

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

    def _end(self, why: str, *, final: bool = False) -> None:
        """The session is over: answer the cells still waiting with the reason, once. Final:
        the kernel stays (``poll`` says alive) and answers every request from now on."""
        if self.died is not None or self.final is not None:
            return
        if final:
            self.final = why
            log.warning("kernel %s: %s", self.kernel_id, why)
        else:
            self.died = why
            log.error("kernel %s: %s", self.kernel_id, why)
        self.state = "ended"
        for ident, header in list(self._pending.values()):
            self._tell(ident, header, why)
        self._pending.clear()
        self.changed.set()

    def _answer_ended(self, channel: Channel, parts: list[bytes]) -> None:
        """A request to a kernel whose session ended on purpose, answered here: an execute
        request with the reason, kernel info (a tab that connects now), a shutdown (the
        provisioner's ``poll`` then reports the exit), and any other request with an error."""
        session = self._session()
        try:  # checks the signature: only a client holding the key is answered
            ident, rest = session.feed_identities(parts, copy=True)
            msg = session.deserialize(rest, content=True)
        except Exception as exc:
            log.info("kernel %s: an unreadable request after its end (%s)", self.kernel_id, exc)
            return
        header = dict(msg["header"])
        kind = str(header.get("msg_type", ""))
        assert self.final is not None
        if kind == "execute_request":
            self._tell(ident, header, self.final)
            return
        if not kind.endswith("_request") or channel == "stdin":
            return
        reply = kind.removesuffix("_request") + "_reply"
        content: dict[str, Any]
        if kind == "kernel_info_request":
            content = _ended_kernel_info(self.final)
        elif kind == "shutdown_request":
            content = {"status": "ok", "restart": bool(msg["content"].get("restart", False))}
        elif kind == "interrupt_request":
            content = {"status": "ok"}
        else:
            content = {"status": "error", "ename": "KernelEnded", "evalue": self.final}
            content["traceback"] = []
        self._say(ident, header, "status", {"execution_state": "busy"})
        self._say(ident, header, reply, content, channel=channel)
        self._say(ident, header, "status", {"execution_state": "idle"})
        if kind == "shutdown_request":
            self.exit_code = 0  # the kernel is shut down: its provisioner's poll says so
            self.changed.set()

    # -- the cells in flight (to answer them if the kernel dies under them) ----------------------

    def _remember(self, parts: list[bytes]) -> bool:
        """Keep an execute request (True) until its reply comes."""
        header = part(parts, 2)
        if header is not None and header.get("msg_type") == "execute_request":
            i = parts.index(DELIM)
            self._pending[str(header.get("msg_id"))] = (parts[:i], header)
            return True
        return False

    def _after_execute(self, m: KernelMessage) -> None:
        """A cell's reply went to its client: the workspace brings its outputs back."""
        header, parent = m.header(), m.parent()
        if header is None or parent is None or header.get("msg_type") != "execute_reply":
            return

        async def after() -> None:
            text = await self.workspace.after_execute()
            if text and self.died is None:
                self._stream(parent, text)

        self.tasks.append(asyncio.ensure_future(after()))
        self.tasks = [t for t in self.tasks if not t.done()]

    def _answered(self, parts: list[bytes]) -> None:
        parent = part(parts, 3)
        if parent is not None:
            self._pending.pop(str(parent.get("msg_id")), None)

    def _tell(self, ident: list[bytes], parent: dict[str, Any], why: str) -> None:
        ename = "KernelEnded" if self.final is not None else "KernelDied"
        error = {"ename": ename, "evalue": why, "traceback": [why]}
        self._say(ident, parent, "error", error)
        self._say(ident, parent, "status", {"execution_state": "idle"})
        reply = {"status": "error", "execution_count": None, **error}
        self._say(ident, parent, "execute_reply", reply, channel="shell")

    def _stream(self, parent: dict[str, Any], text: str) -> None:
        """A line of the relay's own in the cell's output (the workspace's notes). It ends its
        line: the kernel's own output may still arrive after it (its IOPub trails its reply)."""
        text = text if text.endswith("\n") else text + "\n"
        self._say([], parent, "stream", {"name": "stderr", "text": text})

    def _say(
        self,
        ident: list[bytes],
        parent: dict[str, Any],
        msg_type: str,
        content: dict[str, Any],
        *,
        channel: Channel = "iopub",
    ) -> None:
        """A message of the relay's own to a cell's client, signed with the connection's key."""
        session = self._session()
        if channel == "iopub":
            session.send(self.socks["iopub"], msg_type, content, parent=parent)
        else:
            session.send(self.socks[channel], msg_type, content, parent=parent, ident=ident)

    def _session(self) -> Any:
        """The connection's signing session (jupyter_client's), made on first use."""
        if self._signer is None:
            from jupyter_client.session import Session

            key = self.conn.get("key", b"")
            self._signer = Session(
                key=key if isinstance(key, bytes) else str(key).encode(),
                signature_scheme=self.conn.get("signature_scheme", "hmac-sha256"),
                username="gpulayer",
            )
        return self._signer


def _ended_kernel_info(why: str) -> dict[str, Any]:
    """The kernel info an ended kernel gives (a notebook opened now connects and reads why)."""
    import platform

    from .. import __version__

    return {
        "status": "ok",
        "protocol_version": "5.3",
        "implementation": "gpulayer-ended",
        "implementation_version": __version__,
        "language_info": {
            "name": "python",
            "version": platform.python_version(),
            "mimetype": "text/x-python",
            "file_extension": ".py",
        },
        "banner": why,
        "help_links": [],
    }
