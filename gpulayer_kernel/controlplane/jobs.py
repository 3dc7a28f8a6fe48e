"""The job table: every job the control plane knows, and the one path by which a job changes.

Active jobs (queued, placed, running) live in memory and are written through to the store; the
most recently finished ones stay in a small cache, since a job's end is when every waiter reads
it. Every change, whatever asks for it (a placement, a cancel, a finish report, a gang node's
result, a pending report, progress, a retry), is checked against ``states`` and committed here:

- ``stage``: check the change against the transition table and apply it in memory (no await, so
  nothing else runs between the check and the change);
- ``flush``: write staged jobs to the store in one group commit, emit one event each, wake each
  job's waiters, then tell ``on_change`` (the control plane's wiring) what changed.

``commit`` is the two together. A scheduling pass stages many placements, then flushes them at
once. ``grouped`` does the same for a worker's report of many jobs' ends: the flushes that the
tasks applying its entries ask for are held back and made as one when they are all done (one
group commit, then one event each and the waiters woken, in the order staged).

``fold`` keeps a staged change back for the job's next flush: a short job's start, reported
with its end (protocol 1.1), is written with the end, one write of the job for both. Pending
reports and progress are flushed without a store write (they are recomputed or resent), and a
pending report whose reasons did not change is not announced.

A write the store refuses because it is unreachable (503) leaves the change in memory and marks
the job *dirty*: it is written with the next flush, or by a retry with backoff once the store
answers again, so a database that goes away and comes back loses nothing that was staged (a new
job is taken back instead: its submitter was told it failed).

``stage`` is also where secret values are masked in what a job carries from its workers (its
result, progress fields and reason): whoever reports them, nothing unmasked is kept, stored,
announced or served. Workers mask first; this is the second layer.

And it is where attempts are accounted (``provisioning/ledger.py``, ADR 0011): a placement opens
the attempt's record in ``Job.history`` with its estimate, an end closes it with its charge; the
ledger rows that come with them are written by ``flush`` in the same group commit as the job.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import ADMIN_USER, Artifact, CostEntry, Job, JobSpec, JobState
from ..errors import Conflict, InvalidInput, NotFound, Unavailable
from ..store import JobQuery, MetadataStore
from .events import EventLog
from .outage import WhenBack
from .provisioning.ledger import AttemptEnd, Ledger
from .signals import Signals
from .states import check_transition, check_update

log = logging.getLogger("gpulayer.controlplane")
ACTIVE_STATES = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING)
FINISHED_CACHE = 1_024
# The fields a job's workers fill in: they may quote a secret (a job returning os.environ[...]).
REPORTED_FIELDS = ("result", "progress", "reason")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


class Change(NamedTuple):
    """One staged change: the job as it was and as it is now."""

    before: Job
    after: Job


class JobTable:
    """Owns active jobs, the finished-job cache and job numbering; the only writer of jobs."""

    def __init__(
        self,
        store: MetadataStore,
        events: EventLog,
        *,
        clock: Clock = SYSTEM_CLOCK,
        on_change: Callable[[Change], None] | None = None,
        redact: Callable[[Any], Any] | None = None,
    ) -> None:
        """``redact`` masks secrets in a JSON value (``Redactor.redact_json``)."""
        self.store = store
        self.events = events
        self.clock = clock
        self.on_change = on_change
        self.redact = redact
        self.seq = 0
        self._active: dict[str, Job] = {}
        self._finished: OrderedDict[str, Job] = OrderedDict()
        self._signals = Signals(clock)
        self._nodes_done: dict[str, set[str]] = {}  # gang job id -> workers whose node succeeded
        self.dirty: set[str] = set()  # staged changes the store could not take yet
        self._resync = WhenBack(lambda: bool(self.dirty), self.resync, clock, "staged job change")
        self._folded: dict[str, list[Change]] = {}  # staged, written with the job's next flush
        # The event seq of each cached job's last announced change: what a follower has seen.
        self._versions: dict[str, int] = {}
        self.ledger: Ledger | None = None  # the control plane sets one (it prices attempts)
        # Worker id -> its placed or running jobs, kept by ``stage``: a worker's usage is
        # recounted per job start and end, and walking every active job for it made a busy
        # queue quadratic (0.8 ms a recount with 500 jobs active).
        self._on_worker: dict[str, dict[str, Job]] = {}
        self._costs: list[CostEntry] = []  # ledger rows staged, written by the next flush
        # Task -> the changes its flushes held back (``grouped``). Keyed by task, not by a
        # context variable: a task or callback started from one must not join the group.
        self._held: dict[asyncio.Task[Any], list[Change]] = {}
        # Jobs with a change held back: nobody is woken for them until it is stored (a log
        # line of a batch would otherwise show a follower the job's end before it is written).
        self._holding: set[str] = set()

    async def load(self) -> None:
        """Read numbering and the active jobs back from the store (at start)."""
        self.seq = await self.store.max_job_seq()
        for job in await self.store.list_jobs(JobQuery(states=ACTIVE_STATES, limit=1_000_000)):
            self._active[job.id] = job
            self._index(None, job)

    # -- reading ---------------------------------------------------------------------------------

    def active(self) -> list[Job]:
        """Active jobs, oldest first (a copy: safe to await while walking it)."""
        return list(self._active.values())

    def active_job(self, job_id: str) -> Job | None:
        return self._active.get(job_id)

    def on_worker(self, worker_id: str) -> list[Job]:
        """The placed and running jobs of which the worker holds a part, oldest first."""
        return list(self._on_worker.get(worker_id, {}).values())

    def _index(self, before: Job | None, after: Job | None) -> None:
        """Keep ``_on_worker`` in step with one job's change (None: not active)."""
        was = _holders(before)
        now = _holders(after)
        ref = after if after is not None else before
        if ref is None or not (was or now):
            return
        for wid in was:
            if wid not in now:
                held = self._on_worker.get(wid)
                if held is not None:
                    held.pop(ref.id, None)
                    if not held:
                        del self._on_worker[wid]
        if after is not None:
            for wid in now:
                self._on_worker.setdefault(wid, {})[ref.id] = after

    def queued_of(self, owners: set[str]) -> int:
        """How many jobs of these users wait in the queue now."""
        return sum(
            1 for j in self._active.values() if j.state == JobState.QUEUED and j.owner in owners
        )

    def cached(self, job_id: str) -> Job | None:
        """An active or recently finished job, without a store read."""
        return self._active.get(job_id) or self._finished.get(job_id)

    async def resolve(self, job_id: str) -> str:
        """Accept a unique id prefix (at least 4 characters), as git does."""
        if job_id in self._active or job_id in self._finished:
            return job_id
        if len(job_id) < 4:
            raise InvalidInput(
                f"job id {job_id!r} is too short", hint="give at least 4 characters of the id"
            )
        ids = [i for i in self._active if i.startswith(job_id)]
        ids = ids or await self.store.find_job_ids(job_id)
        if not ids:
            raise NotFound(
                f"no job {job_id!r}",
                hint="list jobs with `gpulayer jobs`",
                details={"job": job_id},
                code="job_not_found",
            )
        if len(ids) > 1:
            raise InvalidInput(
                f"job id prefix {job_id!r} is ambiguous", hint="give more characters of the id"
            )
        return ids[0]

    def held_by(self, job_id: str, worker_id: str) -> Job:
        """The active job of which ``worker_id`` holds a part; Conflict (not_assigned) if none."""
        job = self._active.get(job_id)
        if job is None or job.placement is None or worker_id not in job.placement.worker_ids:
            raise Conflict(
                f"job {job_id} is not running on worker {worker_id}",
                hint="the job may have been cancelled, lost or reassigned",
                code="not_assigned",
            )
        return job

    async def get(self, job_id: str) -> Job:
        job_id = await self.resolve(job_id)
        job = self.cached(job_id) or await self.store.get_job(job_id)
        if job is None:  # pragma: no cover - resolve() found it
            raise NotFound(f"no job {job_id!r}", code="job_not_found")
        return job

    async def query(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
        owner: str | None = None,
    ) -> list[Job]:
        """Jobs from the store, newest first; active ones as they are now (with pending reports)."""
        if not 1 <= limit <= 10_000:
            raise InvalidInput("limit must be between 1 and 10000", details={"limit": limit})
        query = JobQuery(states=tuple(states), name=name, label=label, limit=limit, owner=owner)
        return [self._active.get(j.id) or j for j in await self.store.list_jobs(query)]

    # -- waiting ---------------------------------------------------------------------------------

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Return when the job reaches a final state (or at ``timeout`` with its current state)."""
        job_id = await self.resolve(job_id)
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        while True:
            job = await self.get(job_id)
            left = None if deadline is None else deadline - self.clock.monotonic()
            if job.state.terminal or (left is not None and left <= 0):
                return job
            await self._signals.wait(job_id, left)

    def wake(self, job_id: str) -> None:
        """Wake the job's waiters (new log lines, a rendezvous) without changing the job; for a
        job with a change held back (``grouped``), its flush wakes them."""
        if job_id not in self._holding:
            self._signals.fire(job_id)

    async def changed(self, job_id: str, timeout: float | None) -> bool:
        """Wait for the job's next change or wake-up; False when ``timeout`` passed first."""
        return await self._signals.wait(job_id, timeout)

    def close(self) -> None:
        self._signals.fire_all()
        self._resync.close()

    # -- changing: the one commit path -----------------------------------------------------------

    def add(self, spec: JobSpec, owner: str = ADMIN_USER) -> Change:
        """Stage a new queued job, numbered after every job before it; ``flush`` writes it."""
        self.seq += 1
        job = Job(id=new_id(), seq=self.seq, spec=spec, submitted_at=self.clock.now(), owner=owner)
        self._active[job.id] = job
        return Change(job, job)

    def discard(self, job_id: str) -> None:
        """Take back a new job whose first write failed (its submitter is told so)."""
        self._active.pop(job_id, None)
        self.dirty.discard(job_id)
        self._costs = [c for c in self._costs if c.job_id != job_id]  # its estimate goes too

    def stage(
        self,
        job_id: str,
        target: JobState | None = None,
        *,
        ended: AttemptEnd | None = None,
        **fields: Any,
    ) -> Change:
        """Check one change against the tables and apply it in memory; ``flush`` makes it stick.

        With ``target`` the job moves (any field may change with it; a final move stamps
        ``finished_at``); without, only the fields ``states.UPDATES`` allows for its state.
        ``ended`` says how the attempt ended when the move alone does not (a retry, a
        preemption): the ledger records it with the attempt's charge.
        """
        before = self._active.get(job_id)
        if before is None:
            # A final job changes no more (the tables say why); an unknown one was never active.
            final = self._finished.get(job_id)
            if final is not None and target is not None:
                check_transition(job_id, final.state, target)
            raise Conflict(
                f"job {job_id} is not active" + (f" (it is {final.state.value})" if final else ""),
                hint="a job changes only while it is queued, placed or running",
                details={"job": job_id},
                code="illegal_update",
            )
        if self.redact is not None:
            for key in REPORTED_FIELDS:
                if fields.get(key) is not None:
                    fields[key] = self.redact(fields[key])
        if target is None:
            check_update(job_id, before.state, fields)
        else:
            check_transition(job_id, before.state, target)
            fields["state"] = target
            if target.terminal:
                fields.setdefault("finished_at", self.clock.now())
        after = before.model_copy(update=fields)
        if self.ledger is not None and target is not None:
            after, rows = self.ledger.account(before, after, ended)
            self._costs.extend(rows)
        if after.state.terminal or after.state == JobState.QUEUED:
            self._nodes_done.pop(job_id, None)
        self._index(before, None if after.state.terminal else after)
        if after.state.terminal:
            del self._active[job_id]
            self._finished[job_id] = after
            while len(self._finished) > FINISHED_CACHE:
                gone, _ = self._finished.popitem(last=False)
                self._versions.pop(gone, None)
        else:
            self._active[job_id] = after
        return Change(before, after)

    async def flush(
        self, changes: Sequence[Change], *, persist: bool = True, announce: bool = True
    ) -> None:
        """Write staged changes (one group commit), announce them, wake waiters, tell wiring.

        Each job is written once, as it is now, so a change staged by someone else while the
        write was pending is not overwritten by an older copy; events show each change as
        staged. Changes ``fold`` kept back for these jobs go first (when written).
        """
        if self._folded and persist:
            ids = dict.fromkeys(c.after.id for c in changes)
            changes = [*(f for i in ids for f in self._folded.pop(i, [])), *changes]
        if self._held and persist and announce and changes:
            held = self._held.get(asyncio.current_task())  # type: ignore[arg-type]
            if held is not None:
                held.extend(changes)  # written by ``grouped``'s flush, in this order
                self._holding.update(c.after.id for c in changes)
                return
        if persist and changes:
            ids = dict.fromkeys(c.after.id for c in changes)
            await self._save([self.cached(i) or _last(changes, i) for i in ids])
        for change in changes:
            after = change.after
            if after.state.terminal:
                self.events.job(after)
                self._versions[after.id] = self.events.seq
                # Late waiters find the final state in the finished cache or the store.
                self._signals.drop(after.id)
            elif announce:
                self.events.job(after)
                self._versions[after.id] = self.events.seq
                self._signals.fire(after.id)
            if self.on_change is not None:
                self.on_change(change)

    async def _save(self, jobs: list[Job]) -> None:
        """Write jobs (and any left dirty by an outage); an unreachable store marks them dirty."""
        ids = {j.id for j in jobs}
        jobs += [j for i in self.dirty - ids if (j := self.cached(i)) is not None]
        rows, self._costs = self._costs, []
        try:
            if rows:
                await self.store.save_jobs_and_costs(jobs, rows)  # one transaction, both
            else:
                await self.store.save_jobs(jobs)
        except Exception as exc:
            self._costs = rows + self._costs  # written with the next flush: never lost
            if isinstance(exc, Unavailable):
                self.dirty.update(j.id for j in jobs)
                self._resync.kick()
            raise
        if rows:
            assert self.ledger is not None
            self.ledger.on_rows(rows)
        self.dirty.difference_update(j.id for j in jobs)

    async def resync(self) -> None:
        """Write the dirty jobs now (Unavailable while the store is still away)."""
        if self.dirty:
            await self._save([])

    async def commit(
        self,
        job_id: str,
        target: JobState | None = None,
        *,
        ended: AttemptEnd | None = None,
        **fields: Any,
    ) -> Job:
        """Stage and flush one change; returns the job as changed."""
        change = self.stage(job_id, target, ended=ended, **fields)
        await self.flush([change])
        return change.after

    async def grouped(
        self, tasks: Sequence[asyncio.Task[Any]], changes: list[Change] | None = None
    ) -> list[Change]:
        """Wait for ``tasks``, holding back the flushes they ask for, then make them as one flush
        (one group commit; events and wake-ups in the order staged); returns what it flushed
        (also appended to ``changes``, which a caller reads when the flush raised).

        A task's ``commit`` returns once its change is staged, not stored: the caller answers
        nobody before this returns. A flush that fails leaves the changes dirty (in memory,
        written later) and raises here. What the tasks raise is theirs to read (``result``).
        """
        changes = [] if changes is None else changes
        if not tasks:
            return changes
        for task in tasks:
            self._held[task] = changes
        try:
            await asyncio.wait(tasks)
        finally:
            # Even when cancelled: a staged change must reach the store. A task still running
            # (a cancel reached it late) flushes on its own from here on.
            for task in tasks:
                self._held.pop(task, None)
            try:
                if changes:
                    await self.flush(changes)
            finally:
                # After the flush's wake-ups (no await between): they run once this returns.
                self._holding.difference_update(c.after.id for c in changes)
        return changes

    def version(self, job_id: str) -> int:
        """The event seq of the job's last announced change (0: none since this start; a job
        out of the cache is final and changes no more)."""
        return self._versions.get(job_id, 0)

    def fold(self, change: Change) -> None:
        """Keep a staged change back: it is written and announced with the job's next flush
        (``unfold`` hands it back when none came)."""
        self._folded.setdefault(change.after.id, []).append(change)

    def unfold(self, job_id: str) -> list[Change]:
        """The changes ``fold`` still keeps for a job (the caller flushes them)."""
        return self._folded.pop(job_id, [])

    async def note(self, job_id: str, *, announce: bool = True, **fields: Any) -> Job:
        """A change kept in memory only (pending reports, progress): checked, and announced
        (an event, a wake-up) unless ``announce`` is false."""
        change = self.stage(job_id, None, **fields)
        await self.flush([change], persist=False, announce=announce)
        return change.after

    def node_done(self, job_id: str, worker_id: str) -> int:
        """Record that one node of a gang succeeded; returns how many have."""
        done = self._nodes_done.setdefault(job_id, set())
        done.add(worker_id)
        return len(done)


def _holders(job: Job | None) -> tuple[str, ...]:
    """The workers holding a part of a placed or running job (none for any other)."""
    if job is None or job.placement is None:
        return ()
    if job.state not in (JobState.PLACED, JobState.RUNNING):
        return ()
    return tuple(n.worker_id for n in job.placement.nodes)


def _last(changes: Sequence[Change], job_id: str) -> Job:
    return next(c.after for c in reversed(changes) if c.after.id == job_id)


def artifact_named(job: Job, name: str) -> Artifact:
    """The job's artifact called ``name``, or NotFound naming how to list them."""
    for a in job.artifacts:
        if a.name == name:
            return a
    raise NotFound(
        f"job {job.id} has no artifact {name!r}",
        hint="list them with `gpulayer show JOB`",
        code="artifact_not_found",
    )
