"""GPU kernels on the control plane (ADR 0021): the relay of a placed ipykernel's messages.

A GPU kernel is a session (``SessionWorkload(kernel=True)``, started through the session table),
so placement, queueing, quotas, the ledger, idle culling and loss are the session's. This part
adds, per kernel and in memory only:

- the connection's HMAC key, handed to the worker that starts the kernel process (never stored:
  a restarted control plane learns it again when the Jupyter host re-attaches);
- two lanes of raw ZMQ messages (``lanes.py``), *down* (Jupyter host -> worker) and *up* (worker
  -> Jupyter host), bounded in bytes, each read by its side with a cursor: a message stays until
  the reader acknowledges it, so one lost on the wire is sent again. The sides read and write them
  over a stream (``api/streams.py``: one WebSocket per side, the usual way), over HTTP long-polls
  (the fallback), or in-process (the embedded control plane);
- what the relay can see without reading the messages' content: the kernel's iopub status
  (busy/idle, from the frame's header) keeps the session from being idle-culled mid-cell.

The frames pass through unchanged: they are signed by the kernel or the Jupyter client with the
key both already have, and nothing here signs or rewrites them. When the kernel's session ends,
its lanes are freed at once; the kernel is remembered (why it ended) among the last ``KEPT``.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from ...clock import Clock
from ...contracts import JobState, Resources, SessionInfo, SessionSpec
from ...contracts.kernels import (
    LANE_BYTES,
    WAITING_BYTES,
    KernelConnection,
    KernelExit,
    KernelStart,
)
from ...errors import Conflict, Forbidden, InvalidInput, NotFound
from ...security.roles import Identity, check_act
from ...wire.kernels import KernelMessage, KernelStatus, LanePage, part
from ..dispatch import Dispatcher
from ..jobs import JobTable
from ..signals import Signal, first_of
from .lanes import Budget, Lane

if TYPE_CHECKING:
    from .table import SessionTable

KEPT = 256  # kernels remembered before the ended ones are forgotten


class LiveKernel:
    """One kernel's key, lanes and process state."""

    def __init__(self, job_id: str, owner: str, conn: KernelConnection, down: Lane, up: Lane):
        self.id = job_id
        self.owner = owner
        self.connection = conn
        self.down = down
        self.up = up
        self.exited: KernelExit | None = None
        self.started = -1  # the generation whose process said it runs (its first up message)
        self.exit_seq = 0  # the up lane's seq when the process exited
        self.changed = Signal(down.signal._clock)  # its status changed (a stream tells its host)


class KernelRelay:
    """Every live kernel's key and message lanes (built by ``wiring.py``)."""

    def __init__(
        self,
        jobs: JobTable,
        dispatch: Dispatcher,
        sessions: SessionTable,
        *,
        clock: Clock,
    ) -> None:
        self.jobs = jobs
        self.dispatch = dispatch
        self.sessions = sessions
        self.clock = clock
        self.budget = Budget()
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
            env=req.env,
            wait_for_capacity=req.wait_for_capacity,
            kernel=True,
            workspace=req.workspace,  # the notebook's folder (ADR 0022)
        )
        info = await self.sessions.start(spec, who)
        conn = KernelConnection(key=req.key, signature_scheme=req.signature_scheme)
        self._register(info.id, info.job.owner, conn)
        return info

    async def attach(
        self, ref: str, conn: KernelConnection, who: Identity | None = None
    ) -> SessionInfo:
        """Take a live kernel back after a control-plane restart (the key lives in memory)."""
        s, job = await self.sessions.find(ref, who)
        info = self.sessions.info(s, job)
        check_act(who, info.job.owner, f"kernel {info.name}")
        if not info.job.spec.workload.kernel:  # type: ignore[union-attr]
            raise InvalidInput(f"session {info.name} is not a kernel", code="not_a_kernel")
        if info.id not in self._kernels:
            self._register(info.id, info.job.owner, conn)
        return info

    def acting(self, ref: str, who: Identity | None) -> LiveKernel:
        """The kernel ``who`` may drive; ``NotFound`` or ``Forbidden`` otherwise."""
        k = self._kernels.get(ref)
        if k is None:
            raise _unknown(ref)
        check_act(who, k.owner, f"kernel {ref}")
        return k

    async def send(
        self, ref: str, messages: list[KernelMessage], who: Identity | None = None
    ) -> None:
        """Messages for the kernel (shell, control, stdin); ``Busy`` when its lane is full."""
        k = self.acting(ref, who)
        self.check_down(k, messages)
        k.down.put(messages)
        self.sent_down(k, messages)

    def check_down(self, k: LiveKernel, messages: list[KernelMessage]) -> None:
        """Refuse what the host may not send: iopub, a message too large for the lane, anything
        to a kernel whose session is over."""
        if any(m.channel == "iopub" for m in messages):
            raise InvalidInput("the Jupyter host sends no iopub messages", code="bad_channel")
        status = self.status(k)
        if status.state == "ended":
            raise Conflict(
                f"kernel {k.id} has ended: {status.reason}",
                hint="start a new kernel (restart it from the notebook's Kernel menu)",
                details={"kernel": k.id},
                code="kernel_ended",
            )
        k.down.limit = self.down_limit(k)
        for m in messages:
            if self.waiting(k):
                k.down.check(m, "a kernel that is not up yet", most=WAITING_BYTES)
            else:
                k.down.check(m, "the relay")

    def sent_down(self, k: LiveKernel, messages: list[KernelMessage]) -> None:
        if any(m.channel == "shell" for m in messages):
            self.sessions.touch(k.id, None)

    def waiting(self, k: LiveKernel) -> bool:
        return self.status(k).state == "waiting"

    def down_limit(self, k: LiveKernel) -> int:
        """A kernel not up yet takes a small buffer of its host's messages, no more."""
        return WAITING_BYTES if self.waiting(k) else LANE_BYTES

    async def receive(
        self, ref: str, since: int, wait: float, who: Identity | None = None
    ) -> LanePage:
        """The kernel's messages after ``since`` (acknowledging the rest); long-polls ``wait``
        seconds for one or for a change of the kernel's status."""
        k = self.acting(ref, who)
        k.up.ack(since)
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            found = k.up.after(since)
            status = self.status(k)
            told = k.exited is None or k.exit_seq <= since  # the reader saw the exit
            left = deadline - self.clock.monotonic()
            if found or status.state == "ended" or not told or left <= 0:
                return LanePage([m for _, m in found], max(since, k.up.seq), status)
            await first_of(self.clock, left, k.up.signal, k.changed)

    async def interrupt(self, ref: str, who: Identity | None = None) -> None:
        """SIGINT to the kernel process (ipykernel's interrupt: KeyboardInterrupt in the cell)."""
        k = self.acting(ref, who)
        for worker_id in self._workers(k.id):
            self.dispatch.interrupt(worker_id, k.id)

    async def restart(
        self, ref: str, conn: KernelConnection | None = None, who: Identity | None = None
    ) -> LanePage:
        """A new kernel process on the same GPUs (the old one's state is lost)."""
        k = self.acting(ref, who)
        workers = self._workers(k.id)
        if not workers:
            raise Conflict(f"kernel {k.id} is not placed yet: nothing to restart", code="not_up")
        key = conn.key if conn is not None else k.connection.key
        k.connection = KernelConnection(
            key=key,
            signature_scheme=conn.signature_scheme if conn else k.connection.signature_scheme,
            generation=k.connection.generation + 1,
        )
        k.down.clear()
        k.exited = None
        for worker_id in workers:
            self.dispatch.restart(worker_id, k.id)
        k.changed.fire()
        return LanePage([], k.up.seq, self.status(k))

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

    def worker_kernel(self, job_id: str, worker_id: str | None = None) -> LiveKernel:
        """The kernel of a session placed on ``worker_id`` (None: in-process, the caller's);
        another worker's token reads nothing of it (403 ``not_yours``)."""
        k = self._kernels.get(job_id)
        if k is None:
            raise _unknown(job_id)
        if worker_id is not None:
            job = self.jobs.cached(job_id)
            placed = job.placement.worker_ids if job and job.placement else ()
            if worker_id not in placed:
                raise Forbidden(
                    f"kernel {job_id} is not placed on this worker",
                    hint="a worker relays only the kernels of the sessions it runs",
                    details={"kernel": job_id},
                    code="not_yours",
                )
        return k

    async def worker_send(
        self, job_id: str, messages: list[KernelMessage], worker_id: str | None = None
    ) -> None:
        k = self.worker_kernel(job_id, worker_id)
        for m in messages:
            k.up.check(m, "the relay")
        k.up.put(messages, shed_iopub=True)
        self.sent_up(k, messages)

    def sent_up(self, k: LiveKernel, messages: list[KernelMessage]) -> None:
        """The kernel said something: it runs; its busy/idle status keeps the session's clock."""
        if k.started != k.connection.generation:
            k.started = k.connection.generation
            k.changed.fire()
        for m in messages:
            if m.channel == "iopub" and (state := _status(m)) is not None:
                self.sessions.touch(k.id, state == "busy")

    async def worker_receive(
        self, job_id: str, since: int, wait: float, worker_id: str | None = None
    ) -> LanePage:
        k = self._kernels.get(job_id)
        if k is not None:
            self.worker_kernel(job_id, worker_id)
        if k is None:
            # A restarted control plane, before the Jupyter host came back: nothing to send yet.
            await self.connection(job_id, wait)
            k = self._kernels.get(job_id)
            if k is None:
                return LanePage([], since, KernelStatus("waiting", 0, "no Jupyter host yet"))
            self.worker_kernel(job_id, worker_id)
        k.down.ack(since)
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            found = k.down.after(since)
            left = deadline - self.clock.monotonic()
            if found or left <= 0:
                return LanePage([m for _, m in found], max(since, k.down.seq), self.status(k))
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
        k.changed.fire()

    # -- the control plane's calls -----------------------------------------------------------------

    def job_changed(self, job_id: str, terminal: bool) -> None:
        """Its session changed (wiring): readers hear of it; an ended kernel's lanes are freed."""
        k = self._kernels.get(job_id)
        if k is None:
            return
        if terminal:
            k.down.clear()
            k.up.clear()
        k.changed.fire()

    def status(self, k: LiveKernel) -> KernelStatus:
        job = self.jobs.cached(k.id)
        gen = k.connection.generation
        if job is None:
            return KernelStatus("ended", gen, _died(None, None))
        if job.state.terminal:
            # Cancelled (idled out, stopped elsewhere): final. Lost or failed: the Jupyter host
            # may start it again (jupyter_client's restarter).
            final = job.state == JobState.CANCELLED
            return KernelStatus("ended", gen, _died(job.state, job.reason), final)
        if k.exited is not None:
            return KernelStatus("exited", gen, k.exited.reason)
        if job.state == JobState.RUNNING and k.started == gen:
            return KernelStatus("up", gen)
        return KernelStatus("waiting", gen, None if job.state == JobState.RUNNING else job.reason)

    # -- internals --------------------------------------------------------------------------------

    def _lane(self) -> Lane:
        # Numbered from now in microseconds, not from 0: a reader's cursor from a previous life
        # of the control plane is behind every message of this one, so nothing new is skipped.
        return Lane(self.clock, self.budget, int(self.clock.now() * 1_000_000))

    def _register(self, job_id: str, owner: str, conn: KernelConnection) -> None:
        if len(self._kernels) >= KEPT:
            # Ended kernels stay (their readers learn why) until there are many of them.
            for old in [i for i in self._kernels if self._ended(i)]:
                del self._kernels[old]
        self._kernels[job_id] = LiveKernel(job_id, owner, conn, self._lane(), self._lane())
        sig = self._waiting.pop(job_id, None)
        if sig is not None:
            sig.fire()

    def _ended(self, job_id: str) -> bool:
        job = self.jobs.cached(job_id)
        return job is None or job.state.terminal

    def _workers(self, job_id: str) -> list[str]:
        job = self.jobs.cached(job_id)
        if job is None or job.state != JobState.RUNNING or job.placement is None:
            return []
        return list(job.placement.worker_ids)


def _unknown(ref: str) -> NotFound:
    return NotFound(
        f"no live kernel {ref!r} on this control plane",
        hint="a restarted control plane learns its kernels again when their Jupyter host "
        "re-attaches (POST /kernels/{id}/attach); otherwise start the kernel again",
        details={"kernel": ref},
        code="kernel_not_found",
    )


def _died(state: JobState | None, reason: str | None) -> str:
    """Why a kernel's session is over, in the words its cells get."""
    if state == JobState.LOST:
        why = reason or "its worker was lost"
        return f"kernel died: {why}"
    if state is None:
        return "kernel died: its session is gone"
    if state == JobState.CANCELLED:
        why = (reason or "stopped").removeprefix("session ").removeprefix("ended: ")
        return (
            f"this GPU kernel's session ended: {why}; restart the kernel (Kernel ▸ Restart) "
            "to get a GPU again"
        )
    return f"kernel ended: its session was {state.value}" + (f" ({reason})" if reason else "")


def _status(m: KernelMessage) -> str | None:
    """The execution state of an iopub ``status`` message (header and content are JSON)."""
    header = m.header()
    if header is None or header.get("msg_type") != "status":
        return None
    content = part(m.parts, 5)
    state = content.get("execution_state") if content else None
    return state if isinstance(state, str) else None
