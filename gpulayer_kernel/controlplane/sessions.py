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
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import (
    CellAssignment,
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
    SessionHolder,
    SessionInfo,
    SessionReport,
    SessionSpec,
    SessionWorkload,
)
from ..errors import Conflict, InvalidInput, NotFound
from ..redact import Redactor
from ..security.roles import Identity, check_act, check_read
from ..store import MetadataStore
from .cellruns import (
    LiveSession,
    aborted,
    ended_from,
    human_seconds,
    idle_of,
    in_doubt,
    new_cell,
    orphan,
)
from .dispatch import Dispatcher
from .events import EventLog
from .idempotency import CLAIM
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
        self._live: dict[str, LiveSession] = {}
        self._ended: OrderedDict[str, LiveSession] = OrderedDict()
        self._starting: set[str] = set()  # names being started (between the check and the job)
        self._tasks: set[asyncio.Task[object]] = set()
        self.submit: Submit | None = None  # wired by the control plane
        self.cancel: Cancel | None = None

    # -- life ------------------------------------------------------------------------------------

    async def load(self) -> None:
        """After a restart: the sessions of active session jobs, idle from now; the cells
        that had not ended are resumed (each ends with its own worker's report, never runs
        again, and no new cell takes its number: every cell is stored before it runs)."""
        active = [j for j in self.jobs.active() if j.spec.is_session]
        records = {r.id: r for r in await self.store.load_sessions([j.id for j in active])}
        now = self.clock.now()
        for job in active:
            record = records.get(job.id)
            s = LiveSession.of(record, idle_of(job)) if record else LiveSession.lost(job)
            self._live[job.id] = s
            stored = await self.store.list_cells(job.id, limit=RECENT_CELLS)
            s.cells = max(s.cells, stored[0].number if stored else 0)
            if job.state == JobState.RUNNING:
                s.idle_since = now
                self._resume(s, in_doubt(stored))
                if s.running is None:
                    self._arm(s)

    def _resume(self, s: LiveSession, cells: list[CellRun]) -> None:
        """Queue the previous life's unfinished cells as ``resume`` assignments: a worker that
        ran (or runs) one reports it; one that never got it says so, and it ends as not run."""
        for cell in cells:
            s.queue.append(cell.model_copy(update={"state": CellState.QUEUED}))
            s.requests[cell.number] = CellRequest(history=cell.history, all_ranks=cell.all_ranks)
            s.resumed.add(cell.number)
        self._next(s)

    def close(self) -> None:
        for s in self._live.values():
            for timer in (s.timer, s.announcing):
                if timer is not None:
                    timer.cancel()
        for t in self._tasks:
            t.cancel()

    # -- reading ---------------------------------------------------------------------------------

    def info(self, s: LiveSession, job: Job | None = None) -> SessionInfo:
        job = job or self.jobs.cached(s.id)
        assert job is not None
        return s.info(job)

    def _lives(self, s: LiveSession) -> bool:
        """Not ended, even for a moment: a job already final in memory whose write (and so its
        ``job_changed``) is still under way has ended, and its name is free."""
        job = self.jobs.cached(s.id)
        return not s.ended and (job is None or not job.state.terminal)

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

    async def find(self, ref: str, who: Identity | None = None) -> tuple[LiveSession, Job]:
        """A session ``who`` may read, by name (live ones first) or by its job's id (or a
        unique prefix); another user's is ``not_yours``."""
        s, job = await self._find(ref)
        check_read(who, job.owner, f"session {s.name}")
        return s, job

    async def _find(self, ref: str) -> tuple[LiveSession, Job]:
        named = [s for s in self._live.values() if s.name == ref and self._lives(s)]
        named = named or [s for s in self._live.values() if s.name == ref]
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
        s = LiveSession.of(records[0], idle_of(job)) if records else LiveSession.lost(job)
        s.ended = job.state.terminal
        self._remember_ended(s)
        return s, job

    async def _acting(self, ref: str, who: Identity | None) -> tuple[LiveSession, Job]:
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
        taken = next(
            (s for s in self._live.values() if s.name == spec.name and self._lives(s)), None
        )
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
        made: list[LiveSession] = []

        def added(job: Job) -> None:
            # Before the job's first change can reach ``job_changed``: no await in between.
            s = self._live[job.id] = LiveSession(job.id, spec.name, spec.holder, spec.idle_timeout)
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
        s.check_live(job)
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
        claim = CLAIM.get()  # a keyed POST's (ADR 0003): its earlier try may have posted it
        if claim is not None and (earlier := claim.cell_of(s.id)) is not None:
            return await self.follow_cell(s, earlier, 0, wait)
        s.check_runs(job, req.client)
        first_seq = await self.tails.last_seq(s.id)
        s.check_live(self.jobs.cached(s.id) or job)
        # No await from here on: the number and the queue's order are taken together.
        cell = new_cell(s, req, job, self.redactor, self.clock.now(), first_seq)
        number = cell.number
        s.requests[number] = req
        s.queue.append(cell)
        s.unsaved.add(number)
        if claim is not None:
            claim.made_cell(s.id, number)  # queued before the cell's row: committed with it
        self._announce_soon(s)
        try:
            # The cell's number and record are durable before it runs or its POST is answered:
            # a control plane killed after this point resumes it (``load``), and never numbers
            # another cell the same. One write per cell start; concurrent cells share a commit.
            await self.store.save_cells([cell])
        except BaseException:
            with contextlib.suppress(ValueError):
                s.queue.remove(cell)
            s.requests.pop(number, None)
            raise
        finally:
            s.unsaved.discard(number)
        self._next(s)
        return await self.follow_cell(s, number, cell.first_seq, wait)

    async def follow(
        self, ref: str, number: int, since: int, wait: float, who: Identity | None = None
    ) -> CellPage:
        s, _ = await self.find(ref, who)
        return await self.follow_cell(s, number, since, wait)

    async def follow_cell(self, s: LiveSession, number: int, since: int, wait: float) -> CellPage:
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

    async def cell(self, s: LiveSession, number: int) -> CellRun:
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

    def _next(self, s: LiveSession) -> None:
        """Start the next queued cell when none runs (and the ranks are up)."""
        if s.running is not None or not s.queue or s.restarting or s.ended:
            return
        if s.queue[0].number in s.unsaved:
            return  # its record is on its way to the store: the write's end calls this again
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
        a = CellAssignment(
            session_id=s.id,
            number=cell.number,
            request=s.requests[cell.number],
            resume=cell.number in s.resumed,
        )
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

    def _end_of(self, s: LiveSession) -> CellRun:
        """The running cell as its workers' reports say it ended."""
        assert s.running is not None
        job = self.jobs.active_job(s.id)
        cancelled = job.reason if job is not None and job.cancel_requested else None
        return ended_from(s.running, list(s.reports.values()), cancelled, self.clock.now())

    async def _ended_cell(self, s: LiveSession, done: CellRun) -> None:
        s.running = None
        s.requests.pop(done.number, None)
        s.resumed.discard(done.number)
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

    async def _orphan(self, s: LiveSession, report: CellReport, lines: list[LogLine]) -> None:
        """A cell that ran across a control-plane restart: record what its report says."""
        if lines:
            await self.tails.append(s.id, lines)
        s.cells = report.number
        cell = orphan(s.id, report, self.clock.now())
        await self._ended_cell(s, cell)

    # -- interrupts and restarts -----------------------------------------------------------------

    async def interrupt(self, ref: str, who: Identity | None = None) -> SessionInfo:
        """KeyboardInterrupt in the running cell on every rank (the session keeps its state)."""
        s, job = await self._acting(ref, who)
        s.check_live(job)
        if s.running is not None and job.placement is not None:
            for worker_id in job.placement.worker_ids:
                self.dispatch.interrupt(worker_id, s.id)
        return self.info(s, job)

    async def restart(self, ref: str, who: Identity | None = None) -> SessionInfo:
        """Kill every rank and start them again on the same GPUs (their state is lost)."""
        s, job = await self._acting(ref, who)
        s.check_live(job)
        if job.state != JobState.RUNNING or job.placement is None:
            raise Conflict(
                f"session {s.name} is not up yet ({job.state.value}): nothing to restart",
                code="session_not_ready",
            )
        for cell in s.queue:
            why = "the session was restarted before this cell ran"
            await self._ended_cell(s, aborted(cell, why, self.clock.now()))
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

    def _end(self, s: LiveSession, job: Job) -> None:
        """The session's job ended: its cells end with it, their waiters are told why."""
        s.ended = True
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        why = f"the session ended ({job.state.value}" + (f": {job.reason})" if job.reason else ")")
        unfinished = [c for c in (s.running, *s.queue) if c is not None]
        s.running, s.queue = None, deque()
        for cell in unfinished:
            done = aborted(cell, why, self.clock.now())
            s.recent[done.number] = done
            self._spawn(self.store.save_cells([done]))
        del self._live[s.id]
        self._remember_ended(s)
        self.jobs.wake(s.id)

    def _remember_ended(self, s: LiveSession) -> None:
        self._ended[s.id] = s
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _arm(self, s: LiveSession) -> None:
        """Start the idle timer: idle past the timeout, the session's job is cancelled. A
        timer already armed stays (idleness only starts later, never sooner): when it fires,
        ``_expire`` re-arms it for the deadline of the latest idle start."""
        if s.timer is not None:
            return
        since = s.idle_since or self.clock.now()
        left = since + s.idle_timeout - self.clock.now()
        s.timer = self.clock.call_later(max(0.0, left), lambda: self._spawn(self._expire(s)))

    async def _expire(self, s: LiveSession) -> None:
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

    def _announce(self, s: LiveSession, job: Job | None = None) -> SessionInfo:
        if s.announcing is not None:
            s.announcing.cancel()
            s.announcing = None
        info = self.info(s, job)
        self.events.session(info)
        return info

    def _announce_soon(self, s: LiveSession) -> None:
        """Announce cell progress within ``ANNOUNCE_EVERY`` seconds, once for all the cells
        that started or ended meanwhile."""
        if s.announcing is None:
            s.announcing = self.clock.call_later(ANNOUNCE_EVERY, lambda: self._announced(s))

    def _announced(self, s: LiveSession) -> None:
        s.announcing = None
        if not s.ended:
            self._announce(s)


def _is_name(ref: str) -> bool:
    import re

    from ..contracts.sessions import SESSION_NAME_PATTERN

    return re.match(SESSION_NAME_PATTERN, ref) is not None


def _log_error(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("session task failed", exc_info=task.exception())
