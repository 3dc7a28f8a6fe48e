"""Sessions on the control plane (ADR 0019): names, holders, starting and stopping, the job's life.

A session is a job (``SessionWorkload``) that the job table, scheduler, dispatcher and outcomes
handle like any other: it is queued with its explanation, placed, holds its devices, is stopped
(cancelled) or lost. This part keeps what a job does not have:

- its name (unique among live sessions) and *holder*, the client (a kernel) that may run cells
  in it until another attaches: a :class:`SessionRecord` written beside the job;
- its life as its job's: up when the job runs, ended (its cells with it) when the job ends, and
  remembered a while after for ``info`` and its history; after a control-plane restart, the
  sessions of active session jobs are loaded again and their unfinished cells resumed;
- the user's calls on it by name or job id: start, attach, stop, interrupt, restart, and the cell
  calls, which find the session and hand it to its cells part.

Its cells (the queue, their durable start and resume, the workers' reports merged), its status
announcements and its idle timer are ``cells.py`` (:class:`SessionCells`, which
:class:`SessionTable` extends).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import (
    CellPage,
    CellRequest,
    CellRun,
    Job,
    JobSpec,
    JobState,
    SessionHolder,
    SessionInfo,
    SessionReport,
    SessionSpec,
    SessionWorkload,
)
from ...contracts.workspace import WorkspaceView
from ...errors import Conflict, InvalidInput, NotFound
from ...redact import Redactor
from ...security.roles import Identity, check_act, check_read
from ...store import MetadataStore
from ..dispatch import Dispatcher
from ..events import EventLog
from ..idempotency import Claim
from ..jobs import Change, JobTable
from ..logs import LogTails
from .cellruns import LiveSession, aborted, idle_of, in_doubt
from .cells import RECENT_CELLS, Cancel, SessionCells

ENDED_KEPT = 256  # ended sessions remembered for `info` and their history


class Submit(Protocol):
    def __call__(
        self,
        spec: JobSpec,
        *,
        who: Identity | None,
        added: Callable[[Job], None],
        claim: Claim | None,
    ) -> Awaitable[Job]: ...


class SessionTable(SessionCells):
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

    def close(self) -> None:
        for s in self._live.values():
            for timer in (s.timer, s.announcing):
                if timer is not None:
                    timer.cancel()
        for t in self._tasks:
            t.cancel()

    # -- reading ---------------------------------------------------------------------------------

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

    def touch(self, job_id: str, busy: bool | None) -> None:
        """A GPU kernel's activity (ADR 0021), seen by its relay: busy (a cell runs: it is
        never idle-culled), idle from now (False), or a request came (None)."""
        s = self._live.get(job_id)
        if s is None or s.ended:
            return
        if busy:
            s.idle_since = None  # ``_expire`` leaves a session without an idle start alone
            return
        if busy is None and s.idle_since is None:
            return  # a request while a cell runs: still busy
        s.idle_since = self.clock.now()
        self._arm(s)

    def set_workspace(self, job_id: str, view: WorkspaceView) -> None:
        """Where a session's code runs (ADR 0022), as its ``SessionInfo`` shows it."""
        s = self._live.get(job_id)
        if s is not None and s.workspace != view:
            s.workspace = view
            self._announce_soon(s)  # the panel's badge: in place or synced

    def live_ids(self) -> list[str]:
        """The job ids of the live sessions (a handful, where the job table may hold 100,000)."""
        return list(self._live)

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

    async def start(
        self, spec: SessionSpec, who: Identity | None = None, claim: Claim | None = None
    ) -> SessionInfo:
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
            workload=SessionWorkload(
                idle_timeout=spec.idle_timeout, kernel=spec.kernel, workspace=spec.workspace
            ),
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
            job = await self.submit(job_spec, who=who, added=added, claim=claim)
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
        self,
        ref: str,
        req: CellRequest,
        wait: float,
        who: Identity | None = None,
        claim: Claim | None = None,
    ) -> CellPage:
        """Queue one cell; answer within ``wait`` seconds with its output (and end, if it came)."""
        s, job = await self._acting(ref, who)
        if getattr(job.spec.workload, "kernel", False):
            raise InvalidInput(
                f"session {s.name} is a GPU kernel: it runs its notebook's cells, not these",
                hint="run the cell in the notebook that uses the kernel, or start a session",
                code="session_is_kernel",
            )
        return await self.run_cell(s, job, req, wait, claim)

    async def follow(
        self, ref: str, number: int, since: int, wait: float, who: Identity | None = None
    ) -> CellPage:
        s, _ = await self.find(ref, who)
        return await self.follow_cell(s, number, since, wait)

    async def cells(self, ref: str, limit: int = 100, who: Identity | None = None) -> list[CellRun]:
        """A session's cells, newest first (the running and queued ones included)."""
        s, _ = await self.find(ref, who)
        pending = [c for c in (*reversed(s.queue), s.running) if c is not None]
        stored = await self.store.list_cells(s.id, limit)
        seen = {c.number for c in pending}
        # A cell that just ended is in memory before its end is stored (``_ended_cell``).
        ended = (s.recent.get(c.number, c) for c in stored if c.number not in seen)
        return [*pending, *ended][:limit]

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


def _is_name(ref: str) -> bool:
    import re

    from ...contracts.sessions import SESSION_NAME_PATTERN

    return re.match(SESSION_NAME_PATTERN, ref) is not None
