"""Sessions from Python (ADR 0019): a GPU that keeps state across calls, without a kernel.

    from gpulayer_kernel.sessions import start_session

    with start_session(gpus=1, name="train") as s:
        s.run("import torch; x = torch.ones(3)")
        print(s.run("x.sum().item()").text)          # 3.0
        s.push(lr=0.1, w=torch.zeros(10))            # tensors travel as safetensors
        w = s.pull("w")["w"]

A :class:`SessionHandle` is a thin view over the control plane, through a
:class:`~gpulayer_kernel.jupyter.bridge.Bridge` (the embedded default, or ``GPULAYER_URL``): it
holds the session's id and this client's identity, nothing else. The ``%gpulayer session`` magics
use the same handle and render its output into the notebook. (``gpulayer_kernel.client.connect``
is the connection to a control plane.)
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import display, transfer
from .contracts import (
    CellError,
    CellPage,
    CellRequest,
    CellRun,
    CellState,
    LogRecord,
    Resources,
    SessionHolder,
    SessionInfo,
    SessionSpec,
    SessionStatus,
)
from .contracts.jobs import DEFAULT_IDLE_TIMEOUT
from .contracts.workspace import WorkspaceSource
from .errors import Conflict, GPUlayerError, Unavailable

if TYPE_CHECKING:
    from .jupyter.bridge import Bridge

POLL = 25.0  # seconds one follow long-poll waits on the server
# Seconds a cell keeps following its number through an unreachable control plane (one that
# restarts comes back within seconds and resumes the cell under its number, ADR 0019).
RECONNECT = 120.0


def client_id() -> str:
    """This process's identity as a session holder (a new one per process: a restarted kernel
    must attach to take its session back)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_CLIENT = client_id()


class SessionCellError(GPUlayerError):
    """A cell raised in a session; ``error`` is the root cause, as IPython showed it there."""

    code = "cell_raised"
    status = 400

    def __init__(self, cell: CellRun, session: str) -> None:
        error = cell.error
        assert error is not None
        ranked = error.rank is not None and cell.ranks_expected > 1
        where = f" (rank {error.rank})" if ranked else ""
        broken = f"; {cell.broken}" if cell.broken else ""
        super().__init__(
            f"cell {cell.number} of session {session} raised {error.ename}{where}: "
            f"{error.evalue}{broken}",
            hint=restart_hint(session) if cell.broken else _hint_for(error),
            details={"session": cell.session_id, "cell": cell.number, "rank": error.rank},
        )
        self.cell = cell
        self.error: CellError = error
        self.session = session

    def _render_traceback_(self) -> list[str]:
        """What a notebook shows: the remote traceback itself (IPython calls this), and, when
        the cell broke the session, why and how to mend it (not left to the next cell)."""
        lines = list(self.error.traceback) or [f"{self.error.ename}: {self.error.evalue}"]
        if self.cell.ranks_expected > 1 and self.error.rank is not None:
            lines.insert(0, f"\x1b[1m[rank {self.error.rank}]\x1b[0m (the first rank to fail)")
        if self.cell.broken:
            lines += [
                f"gpulayer: session {self.session} is broken: {self.cell.broken}",
                f"hint: {restart_hint(self.session)}",
            ]
        return lines


def restart_hint(session: str) -> str:
    return f"restart it (its state is lost): %gpulayer session restart {session}"


def _hint_for(error: CellError) -> str:
    if error.ename.endswith("OutOfMemoryError"):
        # torch frees the failed allocation and goes on: the session is alive, only full.
        return (
            "the session's GPU ran out of memory; the session keeps its state: free what it "
            "holds (del big_tensor; torch.cuda.empty_cache()), use smaller batches, or "
            "restart it with more GPUs"
        )
    return "the traceback above is the session's; the session keeps its state"


@dataclass
class CellResult:
    """How a cell ended: its value and output, or its error."""

    cell: CellRun
    records: list[LogRecord] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # --out / pull values, decoded

    @property
    def ok(self) -> bool:
        return self.cell.state == CellState.OK

    @property
    def value(self) -> dict[str, Any] | None:
        """Rank 0's displayed value: ``{"data": {mime: ...}, "metadata": {...}}``."""
        return self.cell.value

    @property
    def text(self) -> str:
        """The value's text form (``text/plain``), "" when the cell showed none."""
        return display.text_of(self.cell.value)

    @property
    def stdout(self) -> str:
        return "".join(r.text + "\n" for r in self.records if r.stream == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(r.text + "\n" for r in self.records if r.stream == "stderr")

    def raise_for_error(self, session: str = "") -> CellResult:
        """Raise :class:`SessionCellError` (or why it never ran) unless it succeeded."""
        if self.cell.error is not None:
            raise SessionCellError(self.cell, session or self.cell.session_id)
        if self.cell.state != CellState.OK:
            raise Conflict(
                f"cell {self.cell.number} did not finish: {self.cell.reason or self.cell.state}",
                hint="see `%gpulayer session show`; a broken session needs a restart",
                code="cell_aborted",
            )
        if self.cell.reason:  # it ran, but a value could not come back (--out, pull)
            raise Conflict(self.cell.reason, code="cell_outputs")
        return self


@dataclass
class Transfer:
    """What a push or pull moved, for the line that says so."""

    names: list[str]
    bytes: int
    seconds: float

    def describe(self, verb: str, session: str) -> str:
        size = display.human_bytes(self.bytes)
        return (
            f"{verb} {', '.join(self.names)} ({size}) "
            f"{'to' if verb == 'pushed' else 'from'} session {session} in "
            f"{self.seconds * 1000:.0f} ms"
        )


class SessionHandle:
    """One session, from this client: run cells, move values, interrupt, restart, stop."""

    def __init__(self, bridge: Bridge, info: SessionInfo, client: str = _CLIENT) -> None:
        self.bridge = bridge
        self.id = info.id
        self.name = info.name
        self.client = client
        self._info = info

    # -- state -----------------------------------------------------------------------------------

    @property
    def info(self) -> SessionInfo:
        """The session as the control plane knows it now."""
        self._info = self.bridge.call(lambda s: s.get_session(self.id))
        return self._info

    @property
    def status(self) -> SessionStatus:
        return self.info.status

    def cells(self, limit: int = 100) -> list[CellRun]:
        return self.bridge.call(lambda s: s.session_cells(self.id, limit))

    # -- cells -----------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, Any] | None = None,
        outputs: Sequence[str] = (),
        all_ranks: bool = False,
        count: int | None = None,
        history: bool = True,
        on_records: Callable[[Sequence[LogRecord]], None] | None = None,
        timeout: float | None = None,
    ) -> CellResult:
        """Run ``code`` on every rank and wait for its end.

        ``inputs`` are bound first (JSON as it is; tensors and arrays as a safetensors blob);
        ``outputs`` names variables sent back (rank 0's). ``on_records`` sees the output as it
        comes (a long cell streams); without it the records are in the result. Past
        ``timeout`` seconds the cell is interrupted (and this waits for it to stop).
        """
        request = self._request(code, inputs, outputs, all_ranks, count, history)
        page = self.bridge.call(lambda s: s.run_cell(self.id, request, POLL))
        return self._follow(page, on_records, timeout)

    def _request(
        self,
        code: str,
        inputs: Mapping[str, Any] | None,
        outputs: Sequence[str],
        all_ranks: bool,
        count: int | None,
        history: bool,
    ) -> CellRequest:
        plain: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for name, value in (inputs or {}).items():
            (plain if transfer.is_plain_json(value) else other)[name] = value
        blob = None
        if other:
            data = transfer.encode(other)
            blob = self.bridge.call(lambda s: s.put_blob(data, None))
        return CellRequest(
            code=code,
            client=self.client,
            count=count,
            all_ranks=all_ranks,
            inputs=plain,
            inputs_blob=blob,
            outputs=list(outputs),
            history=history,
        )

    def _follow(
        self,
        page: CellPage,
        on_records: Callable[[Sequence[LogRecord]], None] | None,
        timeout: float | None,
    ) -> CellResult:
        records: list[LogRecord] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        interrupted = False
        lost_at: float | None = None
        while True:
            if page.records:
                if on_records is not None:
                    on_records(page.records)
                else:
                    records.extend(page.records)
            if page.finished:
                return self._result(page.cell, records)
            if deadline is not None and not interrupted and time.monotonic() >= deadline:
                self.interrupt()
                interrupted = True
            left = POLL if deadline is None or interrupted else deadline - time.monotonic()
            try:
                page = self.bridge.call(follow_call(self.id, page, min(max(0.0, left), POLL)))
                lost_at = None
            except Unavailable:
                # Its number stays its own across a control-plane restart: follow it again.
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at > RECONNECT:
                    raise
                time.sleep(1.0)

    def _result(self, cell: CellRun, records: list[LogRecord]) -> CellResult:
        values: dict[str, Any] = dict(cell.outputs)
        if cell.outputs_blob is not None:
            digest = cell.outputs_blob
            values.update(transfer.decode(self.bridge.call(lambda s: s.get_blob(digest))))
        return CellResult(cell, records, values)

    def push(self, values: Mapping[str, Any] | None = None, **named: Any) -> Transfer:
        """Bind kernel values as variables of the session (on every rank)."""
        values = {**(values or {}), **named}
        size = sum(transfer.nbytes(v) for v in values.values())
        started = time.monotonic()
        self.run("", inputs=values, history=False).raise_for_error(self.name)
        return Transfer(sorted(values), size, time.monotonic() - started)

    def pull(self, *names: str) -> dict[str, Any]:
        """The session's variables ``names`` (rank 0's), here."""
        result = self.pull_with_stats(names)[0]
        return result

    def pull_with_stats(self, names: Iterable[str]) -> tuple[dict[str, Any], Transfer]:
        wanted = list(names)
        started = time.monotonic()
        result = self.run("", outputs=wanted, history=False).raise_for_error(self.name)
        size = sum(transfer.nbytes(v) for v in result.outputs.values())
        return result.outputs, Transfer(wanted, size, time.monotonic() - started)

    # -- control ---------------------------------------------------------------------------------

    def interrupt(self) -> SessionInfo:
        """KeyboardInterrupt in the running cell on every rank; the session keeps its state."""
        return self.bridge.call(lambda s: s.interrupt_session(self.id))

    def restart(self, wait: float = 120.0) -> SessionInfo:
        """Kill every rank and start them again (state is lost); returns once they are up."""
        self.bridge.call(lambda s: s.restart_session(self.id))
        return self.wait_ready(wait)

    def stop(self, reason: str = "stopped by the user", wait: float | None = 30.0) -> SessionInfo:
        """End the session and free its GPUs (``reason`` is what its job and cells say).

        ``wait``: seconds to wait until its processes are gone and its GPUs free again (as
        ``cancel`` does for a job; 0 returns at once)."""
        info = self.bridge.call(lambda s: s.stop_session(self.id, reason))
        if wait and info.status != SessionStatus.ENDED:
            self.bridge.call(lambda s: s.wait(self.id, wait))
            info = self.info
        return info

    def attach(self, holder: SessionHolder | None = None) -> SessionInfo:
        holder = holder or SessionHolder(client=self.client)
        self.client = holder.client
        return self.bridge.call(lambda s: s.attach_session(self.id, holder))

    def wait_ready(self, timeout: float | None = None) -> SessionInfo:
        """Wait until the session is up (idle) and return it; raises if it ended instead."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.info
            if info.status == SessionStatus.ENDED:
                raise Conflict(
                    f"session {self.name} ended before it was ready ({info.job.state.value}"
                    + (f": {info.reason})" if info.reason else ")"),
                    hint="`gpulayer logs` of its job says why",
                    code="session_ended",
                )
            if info.status in (SessionStatus.IDLE, SessionStatus.BROKEN):
                return info
            if deadline is not None and time.monotonic() >= deadline:
                return info
            self._wait_change(deadline)

    def _wait_change(self, deadline: float | None) -> None:
        left = POLL if deadline is None else max(0.01, min(POLL, deadline - time.monotonic()))

        async def wait(s: Any) -> None:
            cursor = await s.event_cursor()
            info = await s.get_session(self.id)
            if info.status in (SessionStatus.WAITING, SessionStatus.BUSY):
                await s.events(cursor=cursor, wait=left)

        self.bridge.call(wait)

    def __enter__(self) -> SessionHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<SessionHandle {self.name} ({self.id}) {self._info.status.value}>"


def follow_call(session_id: str, page: CellPage, wait: float) -> Callable[[Any], Any]:
    number, since = page.cell.number, page.next_since
    return lambda s: s.follow_cell(session_id, number, since, wait)


def session_spec(
    name: str,
    *,
    gpus: int = 0,
    nodes: int = 1,
    gpu_kind: Sequence[str] = (),
    fallback: str | Sequence[str] | None = None,
    worker: str | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    wait_for_capacity: bool = False,
    holder: SessionHolder | None = None,
    workspace: WorkspaceSource | None = None,
) -> SessionSpec:
    """The contract ``start_session`` submits (the magics build theirs with it too)."""
    return SessionSpec(
        name=name,
        resources=Resources(
            gpus=gpus,
            nodes=nodes,
            gpu_kind=list(gpu_kind),
            fallback=[fallback] if isinstance(fallback, str) else list(fallback or []),
            worker=worker,
        ),
        idle_timeout=idle_timeout,
        holder=holder or SessionHolder(client=_CLIENT),
        env=dict(env or {}),
        secrets=list(secrets),
        labels=dict(labels or {}),
        wait_for_capacity=wait_for_capacity,
        workspace=workspace,
    )


def start_session(
    name: str = "session",
    *,
    bridge: Bridge | None = None,
    wait: float | None = None,
    **options: Any,
) -> SessionHandle:
    """Start a session (options as :func:`session_spec`) and wait until it is up.

    ``wait``: seconds to wait for it at most (None: as long as it takes; it may queue).
    """
    from .jupyter.bridge import get_bridge

    bridge = bridge or get_bridge()
    spec = session_spec(name, **options)
    info = bridge.call(lambda s: s.start_session(spec))
    handle = SessionHandle(bridge, info, spec.holder.client)
    handle.wait_ready(wait)
    return handle


def attach_session(name: str, *, bridge: Bridge | None = None) -> SessionHandle:
    """Take a live session over (from a restarted kernel, or another script)."""
    from .jupyter.bridge import get_bridge

    bridge = bridge or get_bridge()
    info = bridge.call(lambda s: s.get_session(name))
    handle = SessionHandle(bridge, info)
    handle.attach()
    return handle
