"""Sessions on the control plane (ADR 0019): names, holders, cells, idle timers.

A session is a job (``SessionWorkload``) that the job table, scheduler, dispatcher and outcomes
handle like any other: it is queued with its explanation, placed, holds its devices, is stopped
(cancelled) or lost. This part keeps what a job does not have:

- its name (unique among live sessions) and *holder*, the client (a kernel) that may run cells
  in it until another attaches: a :class:`SessionRecord` written beside the job;
- its cells: each a :class:`CellRun`, numbered per session, run one at a time in order on every
  worker of the session (``Dispatcher.cell``); the workers' reports are merged here (the first
  failing rank is the root cause; a failure on one worker interrupts the others), the cell's
  output records go into the session's log, and the finished cell is written to the store;
- its status (waiting, idle, busy, broken, ended), announced as ``session`` events, and its idle
  timer: idle past its ``idle_timeout``, the session's job is cancelled, which frees its GPUs.

Waiters on a cell (``follow``) park on the session job's signal, which every log append and every
cell end fires: a short cell answers its ``run`` in the same request (ADR 0016: no polling).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..clock import SYSTEM_CLOCK, Clock, Timer
from ..contracts import (
    CellAssignment,
    CellError,
    CellPage,
    CellReport,
    CellRequest,
    CellRun,
    CellState,
    Job,
    JobSpec,
    JobState,
    LogLine,
    LogRecord,
    RankOutcome,
    SessionHolder,
    SessionInfo,
    SessionRecord,
    SessionReport,
    SessionSpec,
    SessionStatus,
    SessionWorkload,
)
from ..errors import Conflict, Forbidden, InvalidInput, NotFound
from ..redact import Redactor
from ..security.roles import Identity, check_act, check_read
from ..store import MetadataStore
from .dispatch import Dispatcher
from .events import EventLog
from .jobs import Change, JobTable
from .logs import LogTails

log = logging.getLogger("gpulayer.controlplane")

RECENT_CELLS = 64  # finished cells of a session kept in memory (the store has all of them)
ENDED_KEPT = 256  # ended sessions remembered for `info` and their history
PAGE = 5_000  # log records read per step when collecting a cell's output
# Cell starts and ends are announced (to the panel's event stream) at most this often per
# session: a loop of quick cells would otherwise put two events per cell on every watcher.
ANNOUNCE_EVERY = 0.25


class Submit(Protocol):
    def __call__(
        self, spec: JobSpec, *, who: Identity | None, added: Callable[[Job], None]
    ) -> Awaitable[Job]: ...


Cancel = Callable[[str, str], Awaitable[Job]]


@dataclass
class _Session:
    """One session as this part knows it: what its record holds (mutable here; written as a
    ``SessionRecord`` when the holder or the broken mark changes), its cells and its timer."""

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

    @classmethod
    def of(cls, record: SessionRecord, idle_timeout: float) -> _Session:
        return cls(record.id, record.name, record.holder, idle_timeout, record.cells, record.broken)

    def record(self) -> SessionRecord:
        return SessionRecord.model_construct(
            id=self.id, name=self.name, holder=self.holder, cells=self.cells, broken=self.broken
        )


class SessionTable:
    """Owns every session's record, cells and idle timer; the control plane's sessions part."""

    def __init__(
        self,
        store: MetadataStore,
        jobs: JobTable,
        dispatch: Dispatcher,
        tails: LogTails,
        events: EventLog,
        redactor: Redactor,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.dispatch = dispatch
        self.tails = tails
        self.events = events
        self.redactor = redactor
        self.clock = clock
        self._live: dict[str, _Session] = {}
        self._ended: OrderedDict[str, _Session] = OrderedDict()
        self._starting: set[str] = set()  # names being started (between the check and the job)
        self._tasks: set[asyncio.Task[object]] = set()
        self.submit: Submit | None = None  # wired by the control plane
        self.cancel: Cancel | None = None

    # -- life ------------------------------------------------------------------------------------

    async def load(self) -> None:
        """After a restart: the sessions of active session jobs, idle from now."""
        active = [j for j in self.jobs.active() if j.spec.is_session]
        records = {r.id: r for r in await self.store.load_sessions([j.id for j in active])}
        now = self.clock.now()
        for job in active:
            record = records.get(job.id) or _lost_record(job)
            s = self._live[job.id] = _Session.of(record, _idle_timeout(job))
            newest = await self.store.list_cells(job.id, limit=1)
            s.cells = max(s.cells, newest[0].number if newest else 0)
            if job.state == JobState.RUNNING:
                s.idle_since = now
                self._arm(s)

    def close(self) -> None:
        for s in self._live.values():
            for timer in (s.timer, s.announcing):
                if timer is not None:
                    timer.cancel()
        for t in self._tasks:
            t.cancel()

    # -- reading ---------------------------------------------------------------------------------

    def info(self, s: _Session, job: Job | None = None) -> SessionInfo:
        job = job or self.jobs.cached(s.id)
        assert job is not None
        status = self._status(s, job)
        idle_since = s.idle_since if s.running is None else None
        ends = (
            idle_since + s.idle_timeout
            if status == SessionStatus.IDLE and idle_since is not None
            else None
        )
        # Built from values this part already holds valid (twice per cell: not re-validated);
        # ``ends_at`` as the contract's own rule computes it.
        return SessionInfo.model_construct(
            id=s.id,
            name=s.name,
            status=status,
            job=job,
            holder=s.holder,
            ranks=_ranks(job),
            cells=s.cells,
            busy_cell=s.running.number if s.running is not None else None,
            idle_since=idle_since,
            idle_timeout=s.idle_timeout,
            reason=s.broken if not job.state.terminal else job.reason,
            ends_at=ends,
        )

    def _status(self, s: _Session, job: Job) -> SessionStatus:
        if job.state.terminal or s.ended:
            return SessionStatus.ENDED
        if job.state != JobState.RUNNING:
            return SessionStatus.WAITING
        if s.broken is not None:
            return SessionStatus.BROKEN
        if s.running is not None or s.queue or s.restarting:
            return SessionStatus.BUSY
        return SessionStatus.IDLE

    def live(self) -> list[SessionInfo]:
        return [self.info(s) for s in self._live.values()]

    def all(self) -> list[SessionInfo]:
        """Live sessions, then the ended ones this process remembers (newest first)."""
        ended = [self.info(s) for s in reversed(self._ended.values()) if self.jobs.cached(s.id)]
        return [*self.live(), *ended]

    def hold(self, job_id: str) -> tuple[str, float | None] | None:
        """For the scheduler's explanations: (holder label, idle since | None) of a session."""
        s = self._live.get(job_id)
        if s is None:
            return None
        return s.holder.label, (s.idle_since if s.running is None else None)

    async def find(self, ref: str, who: Identity | None = None) -> tuple[_Session, Job]:
        """A session ``who`` may read, by name (live ones first) or by its job's id (or a
        unique prefix); another user's is ``not_yours``."""
        s, job = await self._find(ref)
        check_read(who, job.owner, f"session {s.name}")
        return s, job

    async def _find(self, ref: str) -> tuple[_Session, Job]:
        named = [s for s in self._live.values() if s.name == ref]
        named = named or [s for s in reversed(self._ended.values()) if s.name == ref]
        if named:
            s = named[0]
            return s, await self.jobs.get(s.id)
        try:
            job = await self.jobs.get(ref)
        except NotFound:
            raise self._unknown(ref) from None
        except InvalidInput:
            raise self._unknown(ref) from None
        if not job.spec.is_session:
            raise InvalidInput(
                f"job {job.id} is not a session",
                hint="run cells in a session: %gpulayer session start, then %%gpulayer",
                code="not_a_session",
            )
        known = self._live.get(job.id) or self._ended.get(job.id)
        if known is not None:
            return known, job
        records = await self.store.load_sessions([job.id])
        s = _Session.of(records[0] if records else _lost_record(job), _idle_timeout(job))
        s.ended = job.state.terminal
        self._remember_ended(s)
        return s, job

    async def _acting(self, ref: str, who: Identity | None) -> tuple[_Session, Job]:
        """A session ``who`` may act on (its owner, or an admin)."""
        s, job = await self._find(ref)
        check_act(who, job.owner, f"session {s.name}")
        return s, job

    def _unknown(self, ref: str) -> NotFound:
        names = sorted(s.name for s in self._live.values())
        known = f" (live sessions: {', '.join(names)})" if names else " (no session is live)"
        return NotFound(
            f"no session {ref!r}{known}",
            hint=f"start one with %gpulayer session start --name {ref}"
            if _is_name(ref)
            else "list sessions with `gpulayer sessions`",
            details={"session": ref},
            code="session_not_found",
        )

    # -- starting, attaching, stopping -----------------------------------------------------------

    async def start(self, spec: SessionSpec, who: Identity | None = None) -> SessionInfo:
        """Queue a session's job as ``who``'s; its name must be free among live sessions."""
        taken = next((s for s in self._live.values() if s.name == spec.name), None)
        if taken is not None or spec.name in self._starting:
            holder = taken.holder.label if taken is not None else "another client"
            raise Conflict(
                f"a session named {spec.name!r} is already live, held by {holder}",
                hint=f"attach to it (%gpulayer session attach {spec.name}), stop it, or start "
                "this one with another --name",
                details={"session": spec.name, "id": taken.id if taken else None},
                code="session_name_taken",
            )
        job_spec = JobSpec(
            name=spec.name,
            workload=SessionWorkload(idle_timeout=spec.idle_timeout),
            resources=spec.resources,
            env=spec.env,
            secrets=spec.secrets,
            labels=spec.labels,
            wait_for_capacity=spec.wait_for_capacity,
        )
        assert self.submit is not None
        made: list[_Session] = []

        def added(job: Job) -> None:
            # Before the job's first change can reach ``job_changed``: no await in between.
            s = self._live[job.id] = _Session(job.id, spec.name, spec.holder, spec.idle_timeout)
            made.append(s)

        self._starting.add(spec.name)
        try:
            job = await self.submit(job_spec, who=who, added=added)
        finally:
            self._starting.discard(spec.name)
        s = made[0]
        await self.store.save_sessions([s.record()])
        info = self.info(s, self.jobs.cached(job.id) or job)
        self.events.session(info)
        return info

    async def attach(
        self, ref: str, holder: SessionHolder, who: Identity | None = None
    ) -> SessionInfo:
        """Make ``holder`` the session's holder (a restarted kernel takes its session back)."""
        s, job = await self._acting(ref, who)
        self._check_live(s, job)
        s.holder = holder
        await self.store.save_sessions([s.record()])
        return self._announce(s)

    async def stop(
        self, ref: str, reason: str = "stopped by the user", who: Identity | None = None
    ) -> SessionInfo:
        s, job = await self._acting(ref, who)
        if not job.state.terminal:
            assert self.cancel is not None
            job = await self.cancel(s.id, f"session {reason}")
        return self.info(s, job)

    # -- cells -----------------------------------------------------------------------------------

    async def run(
        self, ref: str, req: CellRequest, wait: float, who: Identity | None = None
    ) -> CellPage:
        """Queue one cell; answer within ``wait`` seconds with its output (and end, if it came)."""
        s, job = await self._acting(ref, who)
        self._check_live(s, job)
        if job.state != JobState.RUNNING:
            raise Conflict(
                f"session {s.name} is not up yet ({job.state.value})",
                hint="wait until `%gpulayer session start` says it is ready; "
                f"`gpulayer explain {job.id}` says why it waits",
                details={"session": s.id, "state": job.state.value},
                code="session_not_ready",
            )
        holder = s.holder
        if req.client is not None and req.client != holder.client:
            raise Forbidden(
                f"session {s.name} is held by {holder.label}; only its holder runs cells",
                hint=f"take it over with %gpulayer session attach {s.name}, or start a "
                "session of your own",
                details={"session": s.id, "holder": holder.model_dump()},
                code="session_held",
            )
        if s.broken is not None:
            raise _broken(s)
        first_seq = await self.tails.last_seq(s.id)
        self._check_live(s, self.jobs.cached(s.id) or job)
        # No await from here on: the number and the queue's order are taken together.
        number = s.cells + 1
        s.cells = number
        cell = CellRun(
            session_id=s.id,
            number=number,
            code_sha256=hashlib.sha256(req.code.encode()).hexdigest(),
            code=self.redactor.redact(req.code),
            history=req.history,
            all_ranks=req.all_ranks,
            ranks_expected=_ranks(job),
            submitted_at=self.clock.now(),
            first_seq=first_seq,
        )
        s.requests[number] = req
        s.queue.append(cell)
        self._next(s)
        self._announce_soon(s)
        return await self.follow_cell(s, number, cell.first_seq, wait)

    async def follow(
        self, ref: str, number: int, since: int, wait: float, who: Identity | None = None
    ) -> CellPage:
        s, _ = await self.find(ref, who)
        return await self.follow_cell(s, number, since, wait)

    async def follow_cell(self, s: _Session, number: int, since: int, wait: float) -> CellPage:
        """The cell now, and its records after ``since``; long-polls for either to change."""
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            cell = await self.cell(s, number)
            since = max(since, cell.first_seq)
            records, since = await self._records(s.id, number, since)
            left = deadline - self.clock.monotonic()
            if records or cell.state.done or left <= 0:
                return CellPage(cell=cell, records=records, next_since=since)
            await self.jobs.changed(s.id, left)

    async def cell(self, s: _Session, number: int) -> CellRun:
        for c in (s.running, *s.queue):
            if c is not None and c.number == number:
                return c
        found = s.recent.get(number) or await self.store.get_cell(s.id, number)
        if found is None:
            raise NotFound(
                f"session {s.name} has no cell {number} (it has run {s.cells})",
                code="cell_not_found",
                details={"session": s.id, "cell": number},
            )
        return found

    async def cells(self, ref: str, limit: int = 100, who: Identity | None = None) -> list[CellRun]:
        """A session's cells, newest first (the running and queued ones included)."""
        s, _ = await self.find(ref, who)
        pending = [c for c in (*reversed(s.queue), s.running) if c is not None]
        stored = await self.store.list_cells(s.id, limit)
        seen = {c.number for c in pending}
        return [*pending, *(c for c in stored if c.number not in seen)][:limit]

    async def _records(self, job_id: str, number: int, since: int) -> tuple[list[LogRecord], int]:
        """The cell's records after ``since`` (others' are skipped), and where to go on from."""
        found: list[LogRecord] = []
        while True:
            page = await self.tails.read(job_id, since, PAGE)
            if not page:
                return found, since
            since = page[-1].seq
            found += [r for r in page if r.cell == number]
            if found or len(page) < PAGE:
                return found, since

    def _next(self, s: _Session) -> None:
        """Start the next queued cell when none runs (and the ranks are up)."""
        if s.running is not None or not s.queue or s.restarting or s.ended:
            return
        job = self.jobs.active_job(s.id)
        if job is None or job.placement is None:
            return
        cell = s.queue.popleft()
        s.running = cell.model_copy(
            update={"state": CellState.RUNNING, "started_at": self.clock.now()}
        )
        s.reports = {}
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        a = CellAssignment(session_id=s.id, number=cell.number, request=s.requests[cell.number])
        for worker_id in job.placement.worker_ids:
            self.dispatch.cell(worker_id, a)

    async def report_cell(self, worker_id: str, job: Job, report: CellReport) -> None:
        """One worker's end of a cell; the cell ends when every worker of the session said."""
        s = self._live.get(job.id)
        if s is None:
            return
        n = report.number
        lines = [ln if ln.cell == n else ln.model_copy(update={"cell": n}) for ln in report.lines]
        cell = s.running
        if cell is None or cell.number != n:
            if n > s.cells:
                await self._orphan(s, report, lines)  # from before this control plane started
            return  # a repeated report of a cell that ended: taken once already
        s.reports[worker_id] = report
        if report.broken and s.broken is None:
            s.broken = report.broken
            self._spawn(self.store.save_sessions([s.record()]))
        assert job.placement is not None
        waiting = [w for w in job.placement.worker_ids if w not in s.reports]
        if any(r.status != "ok" for r in report.ranks):
            for w in waiting:  # the root cause is here: the other workers' ranks stop
                self.dispatch.interrupt(w, s.id)
        if waiting:
            if lines:
                await self.tails.append(s.id, lines)
            return
        # The last output lines and the cell's end share one group commit (one thread hop on
        # a short cell's path, not two); its waiters wake once both are stored.
        await asyncio.gather(self.tails.append(s.id, lines), self._ended_cell(s, self._end_of(s)))

    def _end_of(self, s: _Session) -> CellRun:
        """The running cell as its workers' reports say it ended."""
        cell = s.running
        assert cell is not None
        reports = list(s.reports.values())
        ranks = sorted((r for rep in reports for r in rep.ranks), key=lambda r: r.rank)
        error = _root_cause(ranks)
        reason = next((r.reason for r in reports if r.reason), None)
        broken = next((r.broken for r in reports if r.broken), None)
        if error is not None:
            state = CellState.ERROR
        elif broken or any(r.status == "aborted" for r in ranks):
            state = CellState.ABORTED
            job = self.jobs.active_job(s.id)
            if job is not None and job.cancel_requested:  # its worker knows no why: we do
                reason = f"the session ended while this cell ran: {job.reason}"
            reason = reason or broken
        else:
            state = CellState.OK
        zero = next((rep for rep in reports if any(r.rank == 0 for r in rep.ranks)), None)
        value = next((r.value for r in ranks if r.rank == 0), None)
        finished = max((r.finished_at or 0.0 for r in reports), default=0.0) or self.clock.now()
        done = cell.model_copy(
            update={
                "state": state,
                "finished_at": finished,
                "ranks": ranks,
                "error": error,
                "reason": reason,
                "value": value,
                "outputs": zero.outputs if zero else {},
                "outputs_blob": zero.outputs_blob if zero else None,
            }
        )
        return done

    async def _ended_cell(self, s: _Session, done: CellRun) -> None:
        s.running = None
        s.requests.pop(done.number, None)
        s.recent[done.number] = done
        while len(s.recent) > RECENT_CELLS:
            s.recent.popitem(last=False)
        s.idle_since = self.clock.now()
        # Waiters are woken before the write: the result is in ``recent`` already, and the
        # worker's report is acknowledged only once the write is done.
        self.jobs.wake(s.id)
        self._next(s)
        if s.running is None and not s.ended:
            self._arm(s)
        self._announce_soon(s)
        await self.store.save_cells([done])

    async def _orphan(self, s: _Session, report: CellReport, lines: list[LogLine]) -> None:
        """A cell that ran across a control-plane restart: record what its report says."""
        if lines:
            await self.tails.append(s.id, lines)
        s.cells = report.number
        ranks = sorted(report.ranks, key=lambda r: r.rank)
        error = _root_cause(ranks)
        cell = CellRun(
            session_id=s.id,
            number=report.number,
            state=CellState.ERROR if error else CellState.OK,
            code_sha256=hashlib.sha256(b"").hexdigest(),
            code="",
            submitted_at=report.started_at or self.clock.now(),
            started_at=report.started_at,
            finished_at=report.finished_at,
            ranks=ranks,
            error=error,
            reason="it ran while the control plane restarted; its source was not kept",
            value=next((r.value for r in ranks if r.rank == 0), None),
        )
        await self._ended_cell(s, cell)

    # -- interrupts and restarts -----------------------------------------------------------------

    async def interrupt(self, ref: str, who: Identity | None = None) -> SessionInfo:
        """KeyboardInterrupt in the running cell on every rank (the session keeps its state)."""
        s, job = await self._acting(ref, who)
        self._check_live(s, job)
        if s.running is not None and job.placement is not None:
            for worker_id in job.placement.worker_ids:
                self.dispatch.interrupt(worker_id, s.id)
        return self.info(s, job)

    async def restart(self, ref: str, who: Identity | None = None) -> SessionInfo:
        """Kill every rank and start them again on the same GPUs (their state is lost)."""
        s, job = await self._acting(ref, who)
        self._check_live(s, job)
        if job.state != JobState.RUNNING or job.placement is None:
            raise Conflict(
                f"session {s.name} is not up yet ({job.state.value}): nothing to restart",
                code="session_not_ready",
            )
        for cell in s.queue:
            await self._ended_cell(
                s,
                cell.model_copy(
                    update={
                        "state": CellState.ABORTED,
                        "finished_at": self.clock.now(),
                        "reason": "the session was restarted before this cell ran",
                    }
                ),
            )
        s.queue.clear()
        s.restarting = set(job.placement.worker_ids)
        s.broken = None
        for worker_id in job.placement.worker_ids:
            self.dispatch.restart(worker_id, s.id)
        await self.store.save_sessions([s.record()])
        return self._announce(s)

    async def report_session(self, worker_id: str, job: Job, report: SessionReport) -> None:
        s = self._live.get(job.id)
        if s is None:
            return
        if report.status == "broken":
            s.restarting.clear()
            s.broken = report.reason or "it broke"
        else:
            s.restarting.discard(worker_id)
        await self.store.save_sessions([s.record()])
        if not s.restarting:
            s.idle_since = self.clock.now()
            self._next(s)
            if s.running is None:
                self._arm(s)
        self._announce(s)

    # -- the job's life --------------------------------------------------------------------------

    def job_changed(self, change: Change) -> None:
        """Wiring: the session's job moved (running: up; final: ended)."""
        before, after = change
        s = self._live.get(after.id)
        if s is None or before.state == after.state:
            return
        if after.state == JobState.RUNNING:
            s.idle_since = self.clock.now()
            self._arm(s)
        elif after.state.terminal:
            self._end(s, after)
        self._announce(s, after)

    def _end(self, s: _Session, job: Job) -> None:
        """The session's job ended: its cells end with it, their waiters are told why."""
        s.ended = True
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        why = f"the session ended ({job.state.value}" + (f": {job.reason})" if job.reason else ")")
        unfinished = [c for c in (s.running, *s.queue) if c is not None]
        s.running, s.queue = None, deque()
        for cell in unfinished:
            done = cell.model_copy(
                update={"state": CellState.ABORTED, "finished_at": self.clock.now(), "reason": why}
            )
            s.recent[done.number] = done
            self._spawn(self.store.save_cells([done]))
        del self._live[s.id]
        self._remember_ended(s)
        self.jobs.wake(s.id)

    def _remember_ended(self, s: _Session) -> None:
        self._ended[s.id] = s
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _arm(self, s: _Session) -> None:
        """Start the idle timer: idle past the timeout, the session's job is cancelled. A
        timer already armed stays (idleness only starts later, never sooner): when it fires,
        ``_expire`` re-arms it for the deadline of the latest idle start."""
        if s.timer is not None:
            return
        since = s.idle_since or self.clock.now()
        left = since + s.idle_timeout - self.clock.now()
        s.timer = self.clock.call_later(max(0.0, left), lambda: self._spawn(self._expire(s)))

    async def _expire(self, s: _Session) -> None:
        s.timer = None
        if s.ended or s.running is not None or s.queue or s.idle_since is None:
            return
        if self.clock.now() < s.idle_since + s.idle_timeout - 0.001:
            self._arm(s)  # a cell ran meanwhile: wait for the new deadline
            return
        assert self.cancel is not None
        await self.cancel(
            s.id,
            f"session ended: idle for {human_seconds(s.idle_timeout)} (its idle timeout), so its "
            "GPUs were freed; start it again with a longer --idle-timeout to keep it longer",
        )

    def _spawn(self, aw: Awaitable[object]) -> None:
        async def run() -> object:
            return await aw

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_error)

    def _announce(self, s: _Session, job: Job | None = None) -> SessionInfo:
        if s.announcing is not None:
            s.announcing.cancel()
            s.announcing = None
        info = self.info(s, job)
        self.events.session(info)
        return info

    def _announce_soon(self, s: _Session) -> None:
        """Announce cell progress within ``ANNOUNCE_EVERY`` seconds, once for all the cells
        that started or ended meanwhile."""
        if s.announcing is None:
            s.announcing = self.clock.call_later(ANNOUNCE_EVERY, lambda: self._announced(s))

    def _announced(self, s: _Session) -> None:
        s.announcing = None
        if not s.ended:
            self._announce(s)

    def _check_live(self, s: _Session, job: Job) -> None:
        if job.state.terminal or s.ended:
            why = f": {job.reason}" if job.reason else ""
            raise Conflict(
                f"session {s.name} has ended ({job.state.value}{why})",
                hint="start a new one with %gpulayer session start (its state is gone)",
                details={"session": s.id, "state": job.state.value},
                code="session_ended",
            )


def _broken(s: _Session) -> Conflict:
    return Conflict(
        f"session {s.name} is broken: {s.broken}",
        hint=f"restart it (its state is lost): %gpulayer session restart {s.name}",
        details={"session": s.id, "reason": s.broken},
        code="session_broken",
    )


def _root_cause(ranks: list[RankOutcome]) -> CellError | None:
    """The first rank's error that is not an interrupt we sent it, else the first error."""
    errors = [r.error for r in ranks if r.error is not None]
    real = [e for e in errors if e.ename != "KeyboardInterrupt"]
    first = real or errors
    return first[0] if first else None


def _ranks(job: Job) -> int:
    """Processes of a session: one per GPU of each node it holds (one on a CPU)."""
    if job.placement is not None:
        return sum(max(1, len(n.devices)) for n in job.placement.nodes)
    r = job.spec.resources
    return r.nodes * max(1, r.gpus)


def _idle_timeout(job: Job) -> float:
    workload = job.spec.workload
    assert isinstance(workload, SessionWorkload)
    return workload.idle_timeout


def _lost_record(job: Job) -> SessionRecord:
    """A session whose record is missing (written by nothing yet): its job is the truth."""
    return SessionRecord(
        id=job.id, name=job.spec.name, holder=SessionHolder(client="unknown", notebook=None)
    )


def _is_name(ref: str) -> bool:
    import re

    from ..contracts.sessions import SESSION_NAME_PATTERN

    return re.match(SESSION_NAME_PATTERN, ref) is not None


def human_seconds(seconds: float) -> str:
    """``1800`` → ``30 min``; ``90`` → ``90 s``; ``7200`` → ``2 h``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


def _log_error(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("session task failed", exc_info=task.exception())
