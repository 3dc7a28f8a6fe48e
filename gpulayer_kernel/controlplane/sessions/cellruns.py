"""A live session's state and its cells as values (ADR 0019): what ``sessions.SessionTable``
holds per session, and the pure steps of a cell's life — made from a request, ended from its
workers' reports, aborted — with the errors a cell is refused with.

Nothing here awaits or touches another part: the table owns the queue, the store, the timers and
the wake-ups; these functions say what a cell or a session's view *is* at each step.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...clock import Timer
from ...contracts import (
    CellError,
    CellReport,
    CellRequest,
    CellRun,
    CellState,
    Job,
    JobState,
    RankOutcome,
    SessionHolder,
    SessionInfo,
    SessionRecord,
    SessionStatus,
    SessionWorkload,
)
from ...contracts.workspace import WorkspaceView
from ...errors import Conflict, Forbidden
from ...redact import Redactor


@dataclass
class LiveSession:
    """One session as the control plane knows it: what its record holds (mutable here; written
    as a ``SessionRecord`` when the holder or the broken mark changes), its cells and timers."""

    id: str
    name: str
    holder: SessionHolder
    idle_timeout: float
    cells: int = 0  # cells numbered so far (the store's cells table has each one)
    broken: str | None = None
    running: CellRun | None = None
    requests: dict[int, CellRequest] = field(default_factory=dict)  # of running and queued
    queue: deque[CellRun] = field(default_factory=deque)
    reports: dict[str, CellReport] = field(default_factory=dict)  # worker -> its report
    recent: OrderedDict[int, CellRun] = field(default_factory=OrderedDict)
    idle_since: float | None = None
    timer: Timer | None = None
    announcing: Timer | None = None  # a coalesced announcement of cell progress, pending
    restarting: set[str] = field(default_factory=set)  # workers not yet up again
    ended: bool = False
    # Queued cells whose record is not yet in the store: none is sent to a worker before its
    # record is (a control plane that dies in between must not number another cell the same).
    unsaved: set[int] = field(default_factory=set)
    # Cells of the control plane's previous life that had not ended: sent to the workers as
    # ``resume`` (report it if it ran, as not run if it never came), never run again.
    resumed: set[int] = field(default_factory=set)
    workspace: WorkspaceView | None = None  # where its code runs (ADR 0022)

    @classmethod
    def of(cls, record: SessionRecord, idle_timeout: float) -> LiveSession:
        return cls(record.id, record.name, record.holder, idle_timeout, record.cells, record.broken)

    @classmethod
    def lost(cls, job: Job) -> LiveSession:
        """A session whose record is missing (written by nothing yet): its job is the truth."""
        holder = SessionHolder(client="unknown", notebook=None)
        return cls.of(SessionRecord(id=job.id, name=job.spec.name, holder=holder), idle_of(job))

    def record(self) -> SessionRecord:
        return SessionRecord.model_construct(
            id=self.id, name=self.name, holder=self.holder, cells=self.cells, broken=self.broken
        )

    def status(self, job: Job) -> SessionStatus:
        if job.state.terminal or self.ended:
            return SessionStatus.ENDED
        if job.state != JobState.RUNNING:
            return SessionStatus.WAITING
        if self.broken is not None:
            return SessionStatus.BROKEN
        if self.running is not None or self.queue or self.restarting:
            return SessionStatus.BUSY
        return SessionStatus.IDLE

    def info(self, job: Job) -> SessionInfo:
        status = self.status(job)
        idle_since = self.idle_since if self.running is None else None
        ends = (
            idle_since + self.idle_timeout
            if status == SessionStatus.IDLE and idle_since is not None
            else None
        )
        # Built from values this part already holds valid (twice per cell: not re-validated);
        # ``ends_at`` as the contract's own rule computes it.
        return SessionInfo.model_construct(
            id=self.id,
            name=self.name,
            status=status,
            job=job,
            holder=self.holder,
            ranks=ranks_of(job),
            cells=self.cells,
            busy_cell=self.running.number if self.running is not None else None,
            idle_since=idle_since,
            idle_timeout=self.idle_timeout,
            reason=self.broken if not job.state.terminal else job.reason,
            ends_at=ends,
            kernel=getattr(job.spec.workload, "kernel", False),
            workspace=self.workspace,
        )

    # -- what a cell may not do --------------------------------------------------------------------

    def check_live(self, job: Job) -> None:
        if job.state.terminal or self.ended:
            why = f": {job.reason}" if job.reason else ""
            raise Conflict(
                f"session {self.name} has ended ({job.state.value}{why})",
                hint="start a new one with %gpulayer session start (its state is gone)",
                details={"session": self.id, "state": job.state.value},
                code="session_ended",
            )

    def check_runs(self, job: Job, client: str | None) -> None:
        """A cell from ``client`` may run now: the session is up, theirs and not broken."""
        self.check_live(job)
        if job.state != JobState.RUNNING:
            raise Conflict(
                f"session {self.name} is not up yet ({job.state.value})",
                hint="wait until `%gpulayer session start` says it is ready; "
                f"`gpulayer explain {job.id}` says why it waits",
                details={"session": self.id, "state": job.state.value},
                code="session_not_ready",
            )
        if client is not None and client != self.holder.client:
            raise Forbidden(
                f"session {self.name} is held by {self.holder.label}; only its holder runs cells",
                hint=f"take it over with %gpulayer session attach {self.name}, or start a "
                "session of your own",
                details={"session": self.id, "holder": self.holder.model_dump()},
                code="session_held",
            )
        if self.broken is not None:
            raise Conflict(
                f"session {self.name} is broken: {self.broken}",
                hint=f"restart it (its state is lost): %gpulayer session restart {self.name}",
                details={"session": self.id, "reason": self.broken},
                code="session_broken",
            )


# -- a cell's life ---------------------------------------------------------------------------------


def new_cell(
    s: LiveSession, req: CellRequest, job: Job, redactor: Redactor, now: float, first_seq: int
) -> CellRun:
    """The next cell of ``s`` (numbered here: the caller takes the number and queues it at once)."""
    s.cells += 1
    return CellRun(
        session_id=s.id,
        number=s.cells,
        code_sha256=hashlib.sha256(req.code.encode()).hexdigest(),
        code=redactor.redact(req.code),
        history=req.history,
        all_ranks=req.all_ranks,
        ranks_expected=ranks_of(job),
        submitted_at=now,
        first_seq=first_seq,
    )


def ended_from(
    cell: CellRun, reports: Sequence[CellReport], cancelled: str | None, now: float
) -> CellRun:
    """The running ``cell`` as its workers' reports say it ended (``cancelled``: why the
    session's job is being cancelled, which its workers do not know)."""
    ranks = sorted((r for rep in reports for r in rep.ranks), key=lambda r: r.rank)
    error = root_cause(ranks)
    reason = next((r.reason for r in reports if r.reason), None)
    broken = next((r.broken for r in reports if r.broken), None)
    if error is not None:
        state = CellState.ERROR
    elif broken or any(r.status == "aborted" for r in ranks):
        state = CellState.ABORTED
        if cancelled is not None:
            reason = f"the session ended while this cell ran: {cancelled}"
        reason = reason or broken
    else:
        state = CellState.OK
    zero = next((rep for rep in reports if any(r.rank == 0 for r in rep.ranks)), None)
    finished = max((r.finished_at or 0.0 for r in reports), default=0.0) or now
    return cell.model_copy(
        update={
            "state": state,
            "finished_at": finished,
            "ranks": ranks,
            "error": error,
            "reason": reason,
            "value": next((r.value for r in ranks if r.rank == 0), None),
            "outputs": zero.outputs if zero else {},
            "outputs_blob": zero.outputs_blob if zero else None,
            # The cell that broke the session says so itself (not only the next one).
            "broken": broken,
        }
    )


def orphan(session_id: str, report: CellReport, now: float) -> CellRun:
    """A cell that ran across a control-plane restart, as its report says (no source kept)."""
    ranks = sorted(report.ranks, key=lambda r: r.rank)
    error = root_cause(ranks)
    return CellRun(
        session_id=session_id,
        number=report.number,
        state=CellState.ERROR if error else CellState.OK,
        code_sha256=hashlib.sha256(b"").hexdigest(),
        code="",
        submitted_at=report.started_at or now,
        started_at=report.started_at,
        finished_at=report.finished_at,
        ranks=ranks,
        error=error,
        reason="it ran while the control plane restarted; its source was not kept",
        value=next((r.value for r in ranks if r.rank == 0), None),
    )


def in_doubt(cells: Sequence[CellRun]) -> list[CellRun]:
    """The cells of a previous life that had not ended (queued or running), oldest first."""
    return sorted((c for c in cells if not c.state.done), key=lambda c: c.number)


def aborted(cell: CellRun, reason: str, now: float) -> CellRun:
    return cell.model_copy(
        update={"state": CellState.ABORTED, "finished_at": now, "reason": reason}
    )


def root_cause(ranks: Sequence[RankOutcome]) -> CellError | None:
    """The first rank's error that is not an interrupt we sent it, else the first error."""
    errors = [r.error for r in ranks if r.error is not None]
    real = [e for e in errors if e.ename != "KeyboardInterrupt"]
    first = real or errors
    return first[0] if first else None


def ranks_of(job: Job) -> int:
    """Processes of a session: one per GPU of each node it holds (one on a CPU); a GPU kernel
    is one process, whatever GPUs it sees (ADR 0021)."""
    if getattr(job.spec.workload, "kernel", False):
        return 1
    if job.placement is not None:
        return sum(max(1, len(n.devices)) for n in job.placement.nodes)
    r = job.spec.resources
    return r.nodes * max(1, r.gpus)


def idle_of(job: Job) -> float:
    workload = job.spec.workload
    assert isinstance(workload, SessionWorkload)
    return workload.idle_timeout


def human_seconds(seconds: float) -> str:
    """``1800`` → ``30 min``; ``90`` → ``90 s``; ``7200`` → ``2 h``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"
