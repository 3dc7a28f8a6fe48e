"""GPU kernels on the control plane (ADR 0021): the relay of a placed ipykernel's messages.

A GPU kernel is a session (``SessionWorkload(kernel=True)``, started through the sessions part),
so placement, queueing, quotas, the ledger, idle culling and loss are the session's. This part
adds, per kernel and in memory only:

- the connection's HMAC key, handed to the worker that starts the kernel process (never stored:
  a restarted control plane learns it again when the Jupyter host re-attaches);
- two queues of raw ZMQ messages (:class:`Lane`), *down* (Jupyter host -> worker) and *up*
  (worker -> Jupyter host), each long-polled by the side that reads it with a cursor: a message
  stays until the reader asks from past it, so an answer lost on the wire is sent again;
- what the relay can see without reading the messages' content: the kernel's iopub status
  (busy/idle, from the frame's header) keeps the session from being idle-culled mid-cell.

The frames pass through unchanged: they are signed by the kernel or the Jupyter client with the
key both already have, and nothing here signs or rewrites them.
"""

from __future__ import annotations

import base64
import json
import secrets
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...contracts import JobState, Resources, SessionInfo, SessionSpec
from ...contracts.kernels import (
    KernelConnection,
    KernelExit,
    KernelFrame,
    KernelPage,
    KernelStart,
    KernelState,
)
from ...errors import Conflict, InvalidInput, NotFound
from ...security.roles import Identity, check_act
from ..signals import Signal

if TYPE_CHECKING:
    from ..core import ControlPlane

KEPT = 256  # kernels remembered before the ended ones are forgotten
LANE_LIMIT = 20_000  # messages a lane keeps for a reader that does not come (oldest dropped)
DELIM = b"<IDS|MSG>"


@dataclass
class Lane:
    """One direction's messages, numbered; ``after(since)`` drops what the reader has seen."""

    signal: Signal
    items: deque[tuple[int, KernelFrame]] = field(default_factory=deque)
    seq: int = 0

    def put(self, frames: list[KernelFrame]) -> None:
        for f in frames:
            self.seq += 1
            self.items.append((self.seq, f))
        while len(self.items) > LANE_LIMIT:
            self.items.popleft()
        if frames:
            self.signal.fire()

    def after(self, since: int) -> list[KernelFrame]:
        while self.items and self.items[0][0] <= since:
            self.items.popleft()
        return [f for _, f in self.items]


@dataclass
class LiveKernel:
    id: str
    owner: str
    connection: KernelConnection
    down: Lane
    up: Lane
    exited: KernelExit | None = None
    started: int = -1  # the generation whose process said it runs (its first up message)
    exit_seq: int = 0  # the up lane's seq when the process exited


class KernelRelay:
    """Every live kernel's key and message lanes; a part of the ControlPlane (``relay_for``)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.clock = cp.clock
        self._kernels: dict[str, LiveKernel] = {}
        self._waiting: dict[str, Signal] = {}  # workers asking for a kernel not attached yet

    # -- the Jupyter host's calls ------------------------------------------------------------------

    async def start(self, req: KernelStart, who: Identity | None = None) -> SessionInfo:
        """Queue the kernel's session (its sentence is the session's while it waits)."""
        spec = SessionSpec(
            name=req.name or f"kernel-{secrets.token_hex(4)}",
            resources=Resources(gpus=req.gpus, gpu_kind=req.gpu_kind),
            idle_timeout=req.idle_timeout,
            holder=req.holder,
            wait_for_capacity=req.wait_for_capacity,
            kernel=True,
            workspace=req.workspace,  # the notebook's folder (ADR 0022)
        )
        info = await self.cp.start_session(spec, who=who)
        conn = KernelConnection(key=req.key, signature_scheme=req.signature_scheme)
        self._register(info.id, info.job.owner, conn)
        return info

    async def attach(
        self, ref: str, conn: KernelConnection, who: Identity | None = None
    ) -> SessionInfo:
        """Take a live kernel back after a control-plane restart (the key lives in memory)."""
        info = await self.cp.get_session(ref, who=who)
        check_act(who, info.job.owner, f"kernel {info.name}")
        if not info.job.spec.workload.kernel:  # type: ignore[union-attr]
            raise InvalidInput(f"session {info.name} is not a kernel", code="not_a_kernel")
        k = self._kernels.get(info.id)
        if k is None:
            self._register(info.id, info.job.owner, conn)
        return info

    async def send(self, ref: str, frames: list[KernelFrame], who: Identity | None = None) -> None:
        """Messages for the kernel (shell, control, stdin)."""
        k = self._acting(ref, who)
        if any(f.channel == "iopub" for f in frames):
            raise InvalidInput("the Jupyter host sends no iopub messages", code="bad_channel")
        k.down.put(frames)
        if any(f.channel == "shell" for f in frames):
            self._touch(k.id, busy=None)

    async def receive(
        self, ref: str, since: int, wait: float, who: Identity | None = None
    ) -> KernelPage:
        """The kernel's messages after ``since``; long-polls ``wait`` seconds for one or for the
        kernel's end (its session's job ending wakes it)."""
        k = self._acting(ref, who)
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            frames = k.up.after(since)
            page = self._page(k, frames, since)
            left = deadline - self.clock.monotonic()
            told = k.exited is None or k.exit_seq <= since  # the reader saw the exit
            if frames or page.state == "ended" or not told or left <= 0:
                return page
            up = k.up.signal.wait(left)
            await _first(up, self.cp.jobs.changed(k.id, left))

    async def interrupt(self, ref: str, who: Identity | None = None) -> None:
        """SIGINT to the kernel process (ipykernel's interrupt: KeyboardInterrupt in the cell)."""
        k = self._acting(ref, who)
        for worker_id in self._workers(k.id):
            self.cp.dispatch.interrupt(worker_id, k.id)

    async def restart(
        self, ref: str, conn: KernelConnection | None = None, who: Identity | None = None
    ) -> KernelPage:
        """A new kernel process on the same GPUs (the old one's state is lost)."""
        k = self._acting(ref, who)
        workers = self._workers(k.id)
        if not workers:
            raise Conflict(f"kernel {k.id} is not placed yet: nothing to restart", code="not_up")
        key = conn.key if conn is not None else k.connection.key
        k.connection = KernelConnection(
            key=key,
            signature_scheme=conn.signature_scheme if conn else k.connection.signature_scheme,
            generation=k.connection.generation + 1,
        )
        k.down.items.clear()
        k.exited = None
        for worker_id in workers:
            self.cp.dispatch.restart(worker_id, k.id)
        return self._page(k, [], k.up.seq)

    # -- the worker's calls -----------------------------------------------------------------------

    async def connection(self, job_id: str, wait: float) -> KernelConnection | None:
        """The key to start the kernel with; None until the Jupyter host attached it."""
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            k = self._kernels.get(job_id)
            left = deadline - self.clock.monotonic()
            if k is not None or left <= 0:
                return k.connection if k is not None else None
            sig = self._waiting.setdefault(job_id, Signal(self.clock))
            await sig.wait(left)

    async def worker_send(self, job_id: str, frames: list[KernelFrame]) -> None:
        k = self._kernels.get(job_id)
        if k is None:
            raise self._unknown(job_id)
        k.started = k.connection.generation
        for f in frames:
            if f.channel == "iopub" and (state := _status(f)) is not None:
                self._touch(k.id, busy=state == "busy")
        k.up.put(frames)

    async def worker_receive(self, job_id: str, since: int, wait: float) -> KernelPage:
        k = self._kernels.get(job_id)
        if k is None:
            # A restarted control plane, before the Jupyter host came back: nothing to send yet.
            await self.connection(job_id, wait)
            k = self._kernels.get(job_id)
            if k is None:
                return KernelPage(state="waiting", reason="the Jupyter host has not attached")
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            frames = k.down.after(since)
            left = deadline - self.clock.monotonic()
            if frames or left <= 0:
                return self._page(k, frames, since, lane=k.down)
            await k.down.signal.wait(left)

    async def worker_exited(self, job_id: str, report: KernelExit) -> None:
        k = self._kernels.get(job_id)
        if k is None or report.generation != k.connection.generation:
            return  # an older process's end, after a restart began
        k.exited = report
        # A place in the lane: the reader hears of the exit once, then long-polls again.
        k.up.seq += 1
        k.exit_seq = k.up.seq
        k.up.signal.fire()

    # -- internals --------------------------------------------------------------------------------

    def _lane(self) -> Lane:
        # Numbered from now in microseconds, not from 0: a reader's cursor from a previous life
        # of the control plane is behind every message of this one, so nothing new is skipped.
        return Lane(Signal(self.clock), seq=int(self.clock.now() * 1_000_000))

    def _register(self, job_id: str, owner: str, conn: KernelConnection) -> None:
        if len(self._kernels) >= KEPT:
            # Ended kernels stay (their readers learn why) until there are many of them.
            for old in [i for i in self._kernels if self._ended(i)]:
                del self._kernels[old]
        self._kernels[job_id] = LiveKernel(
            job_id,
            owner,
            conn,
            self._lane(),
            self._lane(),
        )
        sig = self._waiting.pop(job_id, None)
        if sig is not None:
            sig.fire()

    def _ended(self, job_id: str) -> bool:
        job = self.cp.jobs.cached(job_id)
        return job is None or job.state.terminal

    def _acting(self, ref: str, who: Identity | None) -> LiveKernel:
        k = self._kernels.get(ref)
        if k is None:
            raise self._unknown(ref)
        check_act(who, k.owner, f"kernel {ref}")
        return k

    def _unknown(self, ref: str) -> NotFound:
        return NotFound(
            f"no live kernel {ref!r} on this control plane",
            hint="a restarted control plane learns its kernels again when their Jupyter host "
            "re-attaches (POST /kernels/{id}/attach); otherwise start the kernel again",
            details={"kernel": ref},
            code="kernel_not_found",
        )

    def _workers(self, job_id: str) -> list[str]:
        job = self.cp.jobs.cached(job_id)
        if job is None or job.state != JobState.RUNNING or job.placement is None:
            return []
        return list(job.placement.worker_ids)

    def _page(
        self, k: LiveKernel, frames: list[KernelFrame], since: int, lane: Lane | None = None
    ) -> KernelPage:
        lane = lane or k.up
        job = self.cp.jobs.cached(k.id)
        state: KernelState = "waiting"
        reason: str | None = None
        if job is None or job.state.terminal:
            state = "ended"
            reason = _died(job.state if job else None, job.reason if job else None)
        elif k.exited is not None:
            state, reason = "exited", k.exited.reason
        elif job.state == JobState.RUNNING and k.started == k.connection.generation:
            state = "up"
        elif job.state != JobState.RUNNING:
            reason = job.reason
        return KernelPage(
            frames=frames,
            next_since=max(since, lane.seq),
            state=state,
            generation=k.connection.generation,
            reason=reason,
        )

    def _touch(self, job_id: str, busy: bool | None) -> None:
        touch = getattr(self.cp.sessions, "touch", None)
        if touch is not None:
            touch(job_id, busy)


def _died(state: JobState | None, reason: str | None) -> str:
    if state == JobState.LOST:
        why = reason or "its worker was lost"
        return f"kernel died: {why}"
    if state is None:
        return "kernel died: its session is gone"
    return f"kernel ended: its session was {state.value}" + (f" ({reason})" if reason else "")


def _status(f: KernelFrame) -> str | None:
    """The execution state of an iopub ``status`` message (header and content are JSON)."""
    try:
        parts = f.parts
        i = parts.index(_DELIM64)
        header = json.loads(base64.b64decode(parts[i + 2]))
        if header.get("msg_type") != "status":
            return None
        content = json.loads(base64.b64decode(parts[i + 5]))
        state = content.get("execution_state")
        return state if isinstance(state, str) else None
    except (ValueError, IndexError, TypeError):
        return None


_DELIM64 = base64.b64encode(DELIM).decode()


async def _first(*aws: object) -> None:
    """Wait for whichever of the waits ends first; cancel the others."""
    import asyncio

    tasks = [asyncio.ensure_future(a) for a in aws]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


_RELAYS: weakref.WeakKeyDictionary[ControlPlane, KernelRelay] = weakref.WeakKeyDictionary()


def relay_for(cp: ControlPlane) -> KernelRelay:
    """The control plane's kernel relay, made on first use (it holds nothing durable)."""
    relay = _RELAYS.get(cp)
    if relay is None:
        relay = _RELAYS[cp] = KernelRelay(cp)
    return relay
