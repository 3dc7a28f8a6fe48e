"""A GPU kernel on its worker (ADR 0021): a real ipykernel, its messages relayed over HTTP.

The agent runs a :class:`KernelExecutor` for a session job whose workload is a kernel, in place of
the session's IPython ranks. It asks the control plane for the connection's key (the Jupyter
host's: frames pass through unchanged, nothing is signed twice), writes a connection file on
loopback with every port 0, and starts ``ipykernel_launcher`` in its own process group with the
session's environment (its GPUs' ``CUDA_VISIBLE_DEVICES``). The kernel binds ports the system
picks and writes them into the file; the worker reads them there and connects as a client (DEALER
for shell, control and stdin; SUB for iopub) and relays raw multipart messages:

- *down*: the control plane's lane for this kernel, read on one WebSocket stream
  (``wire/stream.py``; HTTP long-polls where WebSockets do not pass), each message sent on its
  channel as it came (the Jupyter clients' routing identities stay in front of the delimiter, so
  the kernel's replies carry them back: one DEALER serves every client, with no table);
- *up*: whatever the kernel sends, batched while the previous send is in flight. An iopub message
  over ``OUTPUT_CAP`` (a 20 MB print, a huge image) is replaced by a note of its size, signed
  with the kernel's key: it never blocks the lane, and the cell goes on.

Only outbound connections leave the worker (it works behind NAT, as the worker's own
long-poll); no ZMQ port is reachable from another machine. Heartbeats are answered on the Jupyter
host: the kernel's liveness is its session's (a lost worker ends the session, and the host says
so).

An interrupt is SIGINT to the kernel's process group (ipykernel's ``interrupt_mode = "signal"``);
a restart kills the process and starts another with the key the control plane holds now; the
process exiting on its own (a shutdown request, a crash) is reported, and the GPUs stay held until
the Jupyter host restarts the kernel or stops its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import FinishReport, Job, JobAssignment
from ...contracts.kernels import (
    OUTPUT_CAP,
    Channel,
    KernelConnection,
    KernelExit,
)
from ...display import human_bytes
from ...errors import GPUlayerError
from ...wire.kernels import KernelMessage
from ...wire.outbox import Outbox
from ..backoff import backoff
from ..config import ExecutorConfig
from ..exits import describe_exit
from ..ports import PortReservations
from ..processes import killpg
from ..transport import Transport
from ..warm import WarmRunner
from .attempt import RESTART, STOP, SessionAttempt

log = logging.getLogger("gpulayer.worker")

LONG_POLL = 25.0  # seconds one read of the down lane waits; news comes at once
STOP_WAIT = 3.0  # seconds the kernel gets to leave after SIGTERM before SIGKILL
CHANNELS: tuple[Channel, ...] = ("shell", "control", "stdin")
BIND_WAIT = 120.0  # seconds a new kernel process may take to bind its ports
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


class KernelExecutor:
    """One GPU kernel's process on this worker, for one attempt of its session's job: a sibling
    of ``SessionExecutor`` over the same kind of attempt (``attempt.py``), with no rank group and
    no cells (the Jupyter host talks to the kernel itself)."""

    def __init__(
        self,
        assignment: JobAssignment,
        transport: Transport,
        config: ExecutorConfig,
        *,
        ports: PortReservations,
        warm: WarmRunner | None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.at = SessionAttempt(assignment, transport, config, ports=ports, warm=warm, clock=clock)
        self.clock = clock
        self.link = transport.kernel_link()
        self.proc: asyncio.subprocess.Process | None = None
        self.generation = -1
        self._socks: dict[Channel, Any] = {}
        self._ctx: Any = None
        self._pumps: list[asyncio.Task[None]] = []
        self.outbox = Outbox(
            lambda batch: self.link.send(self.job.id, batch),
            f"kernel {self.job.id}",
            sleep=self.clock.sleep,
        )
        self._since = 0
        self._conn: KernelConnection | None = None  # the running process's key
        self._quiet = False  # a stop or restart of ours: the process's end is not news

    @property
    def job(self) -> Job:
        return self.at.job

    # -- the agent's side ------------------------------------------------------------------------

    def cancel(self, reason: str = "stopped") -> None:
        self.at.cancel(reason)

    def interrupt(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            killpg(self.proc.pid, signal.SIGINT)

    def restart(self) -> None:
        """Kill the kernel's process and start another with the key the control plane holds."""
        self.at.restart()

    def cleanup(self) -> None:
        self.at.cleanup()

    # -- life ------------------------------------------------------------------------------------

    async def run(self) -> FinishReport:
        return await self.at.live("kernel", self._start_kernel, self._serve, self._stop)

    async def _serve(self) -> None:
        self._pumps.append(asyncio.create_task(self._down()))
        self._pumps.append(asyncio.create_task(self.outbox.run()))
        at = self.at
        while not at.cancelled.is_set():
            item = await at.queue.get()
            if item == STOP:
                break
            if item == RESTART:
                at.restarting.clear()
                await self._stop_kernel()
                await self._start_kernel()

    async def _stop(self) -> None:
        for t in self._pumps:
            t.cancel()
        await self._stop_kernel()
        await self.link.close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def _connection(self) -> KernelConnection:
        tries = 0
        while not self.at.cancelled.is_set():
            try:
                conn = await self.link.connection(self.job.id, LONG_POLL)
                if conn is not None and conn.generation > self.generation:
                    return conn
            except GPUlayerError as exc:
                log.info("kernel %s: no connection yet (%s)", self.job.id, exc.message)
            await self.clock.sleep(backoff(tries))  # retry backoff: the host is not attached
            tries += 1
        raise GPUlayerError("the kernel was stopped before its Jupyter host attached")

    async def _start_kernel(self) -> None:
        import zmq
        import zmq.asyncio

        conn = await self._connection()
        self.generation = conn.generation
        self._conn = conn
        at = self.at
        at.dir.mkdir(parents=True, exist_ok=True)
        path = at.dir / f"kernel-{conn.generation}.json"
        write_unbound(path, conn)
        # One process sees every GPU of the placement (rank 0); more ranks are ADR 0021's gap.
        env = at.rank_env(0, 0, nproc=1, world_size=1, master=None)
        env["JPY_PARENT_PID"] = str(os.getpid())
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", str(path)]
        self.proc = proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(at.cwd),  # the notebook's folder (ADR 0022), or the session's own
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._quiet = False
        at.system(f"kernel up: ipykernel pid {proc.pid} (start {conn.generation})")
        self._readers = [
            asyncio.create_task(self._log_output(proc)),
            asyncio.create_task(self._watch(proc)),
        ]
        info = await bound_ports(path, proc)
        if info is None:  # it exited first (``_watch`` says how), or hung: it is stopped
            if proc.returncode is None:
                at.system(f"the kernel bound no ports within {BIND_WAIT:g}s: stopped")
                killpg(proc.pid, signal.SIGKILL)
            return
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        url = "tcp://127.0.0.1:{}"
        # One identity on shell, control and stdin, as Jupyter's clients do: the kernel sends
        # an ``input()`` request on stdin to the identity its execute request came from.
        ident = f"gpulayer-{self.job.id}-{conn.generation}".encode()
        for ch in CHANNELS:
            s = self._ctx.socket(zmq.DEALER)
            s.linger = 0
            s.setsockopt(zmq.IDENTITY, ident)
            s.connect(url.format(info[f"{ch}_port"]))
            self._socks[ch] = s
        sub = self._ctx.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(url.format(info["iopub_port"]))
        self._socks["iopub"] = sub
        self._readers += [asyncio.create_task(self._read(ch, s)) for ch, s in self._socks.items()]

    async def _stop_kernel(self) -> None:
        self._quiet = True
        for t in getattr(self, "_readers", []):
            t.cancel()
        for s in self._socks.values():
            s.close(linger=0)
        self._socks = {}
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_WAIT)
        except TimeoutError:
            killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), STOP_WAIT)

    # -- relaying ----------------------------------------------------------------------------------

    async def _down(self) -> None:
        """The Jupyter host's messages, as the relay hands them over, onto their channels."""
        tries = 0
        while True:
            try:
                page = await self.link.receive(self.job.id, self._since, LONG_POLL)
                tries = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("kernel %s: relay unreachable (%s)", self.job.id, exc)
                await self.clock.sleep(backoff(tries))  # retry backoff
                tries += 1
                continue
            self._since = page.next_since
            for m in page.messages:
                sock = self._socks.get(m.channel)
                if sock is not None:
                    await sock.send_multipart(m.parts)

    async def _read(self, channel: Channel, sock: Any) -> None:
        while True:
            await self.outbox.room()
            parts = await sock.recv_multipart(copy=True)
            m = KernelMessage(channel, parts)
            if channel == "iopub" and m.size > OUTPUT_CAP:
                m = self._note_instead(m)
            self.outbox.put(m)

    def _note_instead(self, m: KernelMessage) -> KernelMessage:
        """An iopub message over the cap, as a note of what it was (signed with the key)."""
        from jupyter_client.session import Session

        header = m.header() or {}
        what = header.get("msg_type", "message")
        text = (
            f"[gpulayer] output dropped: a {human_bytes(m.size)} {what} message is over the "
            f"{human_bytes(OUTPUT_CAP)} a GPU kernel's output message may be; write big "
            "results to a file instead\n"
        )
        log.warning("kernel %s: %s", self.job.id, text.strip())
        conn = self._conn
        assert conn is not None
        session = Session(
            key=conn.key.encode(), signature_scheme=conn.signature_scheme, username="gpulayer"
        )
        msg = session.msg("stream", {"name": "stderr", "text": text}, parent=m.parent() or {})
        return KernelMessage("iopub", session.serialize(msg, ident=m.idents() or None))

    async def _log_output(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            self.at.shipper.add("stderr", line.decode(errors="replace").rstrip("\n"))

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if self._quiet or self.at.cancelled.is_set():
            return
        why = describe_exit(code, "the kernel process")
        self.at.system(why)
        report = KernelExit(generation=self.generation, code=code, reason=why)
        with contextlib.suppress(GPUlayerError):
            await self.link.exited(self.job.id, report)


def write_unbound(path: Path, conn: KernelConnection) -> None:
    """The kernel's connection file with every port 0: ipykernel binds ports the system picks
    and writes them back into the file. Ports picked free here and bound by the kernel a second
    later could be taken meanwhile (``Address already in use``). Loopback only: the Jupyter
    host reaches them through the relay. Owner-only, as jupyter_client writes it (the key)."""
    info = {
        "ip": "127.0.0.1",
        "transport": "tcp",
        "key": conn.key,
        "signature_scheme": conn.signature_scheme,
        "kernel_name": "",
        **dict.fromkeys(PORTS, 0),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)


async def bound_ports(path: Path, proc: asyncio.subprocess.Process) -> dict[str, Any] | None:
    """The ports the kernel bound, once its connection file names them all; None if it exited
    first or took longer than ``BIND_WAIT``. ipykernel writes the file once its sockets are
    bound (before it serves), so this waits no longer than the kernel needs to start anyway.

    Real time, not the executor's clock: this waits on another process, not on a timer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BIND_WAIT
    while proc.returncode is None and loop.time() < deadline:
        with contextlib.suppress(OSError, ValueError):  # read while being written: again
            info: dict[str, Any] = json.loads(path.read_text())
            if all(info.get(p) for p in PORTS):
                return info
        # The file is written by another process with no signal to us: read it again soon.
        await asyncio.sleep(0.02)
    return None
