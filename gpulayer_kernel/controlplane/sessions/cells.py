"""A session's cells and idleness on the control plane (ADR 0019): the queue, its durable
start and resume, the workers' reports merged, the idle timer and the announcements.

:class:`SessionCells` is the part of the session table
(:class:`~gpulayer_kernel.controlplane.sessions.table.SessionTable`) that moves cells: each a
:class:`CellRun`, numbered per session, stored before it runs or its POST is answered, run one at a
time in order on every worker of the session (``Dispatcher.cell``). The workers' reports are merged
here (the first failing rank is the root cause; a failure on one worker interrupts the others), the
cell's output records go into the session's log, and the finished cell is written to the store.
After a restart, the cells that had not ended are resumed (``_resume``): each ends with its own
worker's report and never runs again.

A session with no cell running is idle; idle past its ``idle_timeout``, its job is cancelled,
which frees its GPUs. Cell starts and ends are announced as ``session`` events, coalesced.

Waiters on a cell (``follow_cell``) park on the session job's signal, which every log append and
every cell end fires: a short cell answers its ``run`` in the same request (ADR 0016: no polling).
The table (``table.py``) owns the rest: names, holders, starting and stopping, the job's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ...clock import Clock
from ...contracts import (
    CellAssignment,
    CellPage,
    CellReport,
    CellRequest,
    CellRun,
    CellState,
    Job,
    LogLine,
    LogRecord,
    SessionInfo,
)
from ...errors import NotFound
from ...redact import Redactor
from ...store import MetadataStore
from ..dispatch import Dispatcher
from ..events import EventLog
from ..idempotency import Claim
from ..jobs import JobTable
from ..logs import LogTails
from .cellruns import LiveSession, ended_from, human_seconds, new_cell, orphan

log = logging.getLogger("gpulayer.controlplane")

RECENT_CELLS = 64  # finished cells of a session kept in memory (the store has all of them)
PAGE = 5_000  # log records read per step when collecting a cell's output
# A cell's end is answered from memory; its write waits this long at most for the next write
# (a notebook's next cell comes within milliseconds) to share its commit (``_ended_cell``).
# None: each end is committed at once (bench_session.py measures both).
END_WITHIN: float | None = 0.05
# Cell starts and ends are announced (to the panel's event stream) at most this often per
# session: a loop of quick cells would otherwise put two events per cell on every watcher.
ANNOUNCE_EVERY = 0.25

Cancel = Callable[[str, str], Awaitable[Job]]


class SessionCells:
    """The cells and idle timers of every live session; ``SessionTable`` builds on it."""

    # Set by ``SessionTable.__init__``.
    store: MetadataStore
    jobs: JobTable
    dispatch: Dispatcher
    tails: LogTails
    events: EventLog
    redactor: Redactor
    clock: Clock
    _live: dict[str, LiveSession]
    _tasks: set[asyncio.Task[object]]
    cancel: Cancel | None

    def info(self, s: LiveSession, job: Job | None = None) -> SessionInfo:
        job = job or self.jobs.cached(s.id)
        assert job is not None
        return s.info(job)

    # -- cells -----------------------------------------------------------------------------------

    async def run_cell(
        self, s: LiveSession, job: Job, req: CellRequest, wait: float, claim: Claim | None = None
    ) -> CellPage:
        """Queue one cell; answer within ``wait`` seconds with its output (and end, if it came).
        ``claim``: the keyed POST this runs under (ADR 0003); its earlier try may have posted it."""
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

    async def follow_cell(self, s: LiveSession, number: int, since: int, wait: float) -> CellPage:
        """The cell now, and its records after ``since``; long-polls for either to change."""
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            cell = await self.cell(s, number)
            since = max(since, cell.first_seq)
            records, since, more = await self._records(s.id, number, since)
            left = deadline - self.clock.monotonic()
            if records or cell.state.done or left <= 0:
                return CellPage(cell=cell, records=records, next_since=since, more=more)
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

    async def _records(
        self, job_id: str, number: int, since: int
    ) -> tuple[list[LogRecord], int, bool]:
        """The cell's records after ``since`` (others' are skipped), where to go on from, and
        whether more records wait there (a full page was read: the follower asks again)."""
        found: list[LogRecord] = []
        while True:
            page, more = await self.tails.read_more(job_id, since, PAGE)
            if not page:
                return found, since, False
            since = page[-1].seq
            found += [r for r in page if r.cell == number]
            if found or not more:
                return found, since, more

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
        """One worker's end of a cell; the cell ends when every worker of the session said.

        Its lines are not kept for a store that is away (``LogTails.append``'s ``keep``): a
        refused report is sent again, lines and all."""
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
                await self.tails.append(s.id, lines, keep=False)
            return
        done = self._end_of(s)
        if not lines:  # a quiet cell: no tasks for a gather (two loop turns on its answer's path)
            await self._ended_cell(s, done)
            return
        # The last output lines and the cell's end share one group commit (one thread hop on
        # a short cell's path, not two); its waiters wake once both are stored.
        await asyncio.gather(self.tails.append(s.id, lines, keep=False), self._ended_cell(s, done))

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
        # worker's report is acknowledged only once the write is done. So the write can wait for
        # the next cell's start and share its commit (one commit a cell, not two: the start need
        # not queue behind this end's own). A worker runs one cell at a time, after its report of
        # the last is acknowledged: when a queued cell starts now, the end goes at once.
        self.jobs.wake(s.id)
        self._next(s)
        if s.running is None and not s.ended:
            self._arm(s)
        self._announce_soon(s)
        await self.store.save_cells([done], within=None if s.running is not None else END_WITHIN)

    async def _orphan(self, s: LiveSession, report: CellReport, lines: list[LogLine]) -> None:
        """A cell that ran across a control-plane restart: record what its report says."""
        if lines:
            await self.tails.append(s.id, lines, keep=False)
        s.cells = report.number
        cell = orphan(s.id, report, self.clock.now())
        await self._ended_cell(s, cell)

    def _resume(self, s: LiveSession, cells: list[CellRun]) -> None:
        """Queue the previous life's unfinished cells as ``resume`` assignments: a worker that
        ran (or runs) one reports it; one that never got it says so, and it ends as not run."""
        for cell in cells:
            s.queue.append(cell.model_copy(update={"state": CellState.QUEUED}))
            s.requests[cell.number] = CellRequest(history=cell.history, all_ranks=cell.all_ranks)
            s.resumed.add(cell.number)
        self._next(s)

    # -- idleness and announcements --------------------------------------------------------------

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


def _log_error(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("session task failed", exc_info=task.exception())
