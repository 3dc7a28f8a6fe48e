"""The scheduling loop: when to run the pure scheduler, what to feed it, and applying its plan.

A pass runs soon after anything that could change a placement (``kick``); several changes in one
loop turn share one pass, and under load passes are coalesced: at most one starts per ``tick``
(5 ms), so a stream of submits and finishes shares a pass instead of paying one each (issue 25:
a pass almost per submit was 9% of the server's time). A kick runs its pass on the next loop turn
when no pass started within the last tick or the last one had nothing waiting to place: an idle
system's first placement never waits.

A pass builds a ``Snapshot`` from the job table and worker registry, calls
``schedule(snapshot, cache)`` with the one ``SchedulerCache`` this loop keeps, and applies the
plan: placements through the job table's commit path, assignments through the dispatcher,
pending reports onto waiting jobs. Reservations carry from one pass to the next. A big queue's
pure pass runs on a thread (``THREAD_ABOVE``) and its reports are noted in batches, so requests
are answered meanwhile; passes never overlap, and a kick during one starts the next as it ends.
The scheduler has no clock, so when the next waiting gang job becomes old enough to reserve
devices, a timer on the control plane's clock runs a pass for it.

One bad worker must not stop the cluster: a pass that raises is run again per worker to find the
workers whose data makes it fail (``scheduler/culprits.py``, pure); those are set aside
(``WorkerInfo.unschedulable``, with the error) and the pass goes on without them. Workers under
suspicion or set aside stay in the snapshot, held back (``WorkerView.hold``), so reports count
them.

Fair share and quotas (``scheduler/share.py``) need three facts from outside the pure scheduler:
each user's recent use (``UsageMeter``), the GPU quotas and each user's group (``UserService``);
the snapshot carries them, so a pass stays replayable.

A job that no worker here can ever run (``PlacementReport.never_fits``) fails at its first pass,
saying what exists, unless it asked to wait for capacity (``JobSpec.wait_for_capacity``). With no
workers at all it waits (one may join); a job naming a worker that is known but gone waits for it.

Two additions for providers and retries (ADR 0010, 0011): a retried job waiting out its backoff
(``Job.retry_at``) is left out of passes until then (a timer runs a pass when it is due); and
``annotate``, when the control plane has an autoscaler, adds to each waiting job's report what a
provider can launch for it (``PlacementReport.scaling``) before the reports are stored, so a job
an offer fits is never failed as "can never run".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from ..clock import SYSTEM_CLOCK, Clock, Timer
from ..contracts import (
    Job,
    JobState,
    Placement,
    PlacementReport,
    Reason,
    SessionHold,
    WorkerCapabilities,
    WorkerInfo,
)
from ..scheduler import (
    JobRequest,
    Plan,
    Reservation,
    RunningJob,
    SchedulerCache,
    Snapshot,
    WorkerView,
    gc_paused,
    never_sentence,
    schedule,
    with_sessions,
)
from ..scheduler.culprits import culprits
from ..scheduler.explain import waits_for_gpus, with_holds
from ..scheduler.views import Views
from ..security.users import UserService
from ..store import MetadataStore
from .dispatch import Dispatcher
from .jobs import Change, JobTable
from .logs import LogTails
from .secrets import SecretTable
from .usage import UsageMeter
from .workers import WorkerRegistry

log = logging.getLogger("gpulayer.controlplane")
# The shortest time between two passes' starts under load (seconds): at 1,000 jobs/s, five
# jobs a pass; an idle system's first placement does not wait for it.
PASS_TICK = 0.005
# Under load, a pass starts no sooner after the last one began than that one took, times this:
# a pass over 20,000 waiting jobs takes ~150 ms of the loop, and back to back they left requests
# nothing (500 workers: submit p50 159 ms, p99 643 ms). At 2, passes take at most a third of it
# (p50 3.4 ms); a freed GPU then waits for at most about three passes.
PASS_SHARE = 2.0
# With at least this many waiting jobs, the pure scheduler runs on a thread: a pass over 20,000
# takes ~100 ms of CPU, and on the loop every request arriving meanwhile waited it out (submit
# p99 238 ms at 500 workers). The snapshot is taken and the plan applied on the loop; passes
# never overlap. Below it a thread's hand-off costs more than it saves.
THREAD_ABOVE = 2000
# The loop yields to requests after noting this many waiting jobs' reports (~10 ms of them).
NOTE_BATCH = 500
# Read once: an enum member's lookup is a descriptor call in Python 3.11, and a pass compares
# every active job's state.
_QUEUED = JobState.QUEUED
# What the scheduler reads of a worker set aside: nothing of its own data, which broke a pass.
SET_ASIDE = WorkerCapabilities()


class SchedulingLoop:
    """Runs coalesced scheduling passes and the reservation timer; owns reservations."""

    def __init__(
        self,
        store: MetadataStore,
        jobs: JobTable,
        workers: WorkerRegistry,
        logs: LogTails,
        dispatch: Dispatcher,
        *,
        clock: Clock = SYSTEM_CLOCK,
        reserve_after: float = 60.0,
        secrets: SecretTable,
        users: UserService,
        usage: UsageMeter,
    ) -> None:
        self.store = store
        self.secrets = secrets
        self.users = users
        self.usage = usage
        self.jobs = jobs
        self.workers = workers
        self.dispatch = dispatch
        self.logs = logs
        self.clock = clock
        self.reserve_after = reserve_after
        self.cache = SchedulerCache()
        self.views = Views()
        # Pausing the cyclic collector for a pass pays on big queues (see scheduler.gc_paused),
        # but it is process-wide: only a process that is the control plane's own (``serve``,
        # the Jupyter server extension) may turn this on, never a kernel running user code.
        self.pause_gc = False
        self.reservations: dict[str, Reservation] = {}
        # Sessions holding GPUs on these workers (names), for waiting jobs' sentences (ADR 0019).
        self.session_holds: Callable[[], list[SessionHold]] = list
        self.fresh: set[str] = set()  # jobs submitted since the last pass: never-fit is decided
        # The autoscaler's word on the waiting jobs of a pass (None: no providers here).
        self.annotate: Callable[[Snapshot, Plan], Mapping[str, PlacementReport]] | None = None
        self.on_pass: Callable[[float], None] | None = None  # seconds a pass took (metrics)
        self._pending = False
        self._timer: Timer | None = None
        self.running = False
        # Passes start at most once per tick (loop time); 0 runs one per loop turn, as before.
        self.tick = PASS_TICK
        self._last_start = -PASS_TICK
        self._last_took = 0.0  # seconds the last pass took (loop time)
        self._soon: asyncio.Handle | None = None
        self._busy = False  # the last pass had jobs to place or to report on: under load
        self.thread_above = THREAD_ABOVE
        self._one = asyncio.Lock()  # one pass at a time: a threaded one spans loop turns
        self._inflight = False

    def start(self) -> None:
        self.running = True
        self.kick()

    def close(self) -> None:
        self.running = False
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        self._pending = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def kick(self) -> None:
        """Run a pass soon: on the next loop turn, or at the end of the current tick when a
        pass started within it; every change until then shares that pass."""
        if self._pending or not self.running:
            return
        self._pending = True
        if not self._inflight:  # else the pass in flight starts the next one as it ends
            self._schedule_next()

    def _schedule_next(self) -> None:
        loop = asyncio.get_running_loop()
        gap = max(self.tick, self._last_took * PASS_SHARE) if self.tick else 0.0
        wait = self._last_start + gap - loop.time()
        if wait > 0 and self._busy:
            self._soon = loop.call_later(wait, self._start_pass)
        else:
            self._soon = loop.call_soon(self._start_pass)

    def _start_pass(self) -> None:
        task = asyncio.create_task(self.run_pass())
        task.add_done_callback(_log_task_error)

    def snapshot(self) -> Snapshot:
        """The cluster as the scheduler sees it now."""
        now = self.clock.now()
        running: dict[str, list[RunningJob]] = {}
        pending: list[JobRequest] = []
        views = self.views  # the same objects as last pass where nothing changed (views.py)
        views.begin()
        for job in self.jobs.active():
            if job.state == _QUEUED:
                if job.retry_at is None or job.retry_at <= now:
                    pending.append(views.request(job))
                # else waiting out its retry backoff (a timer runs a pass when it is due)
            elif job.placement is not None:
                for worker_id, held in views.running(job, now):
                    running.setdefault(worker_id, []).append(held)
        suspected = self.workers.suspected
        workers = tuple(_view(views, w, running, suspected(w.id)) for w in self.workers.live())
        views.end()
        users = {j.owner for j in pending}
        shared = len(users) > 1 or bool(self.users.quotas())
        quotas = {q.subject: q.max_gpus for q in self.users.quotas() if q.max_gpus is not None}
        return Snapshot(
            now=now,
            pending=tuple(pending),
            workers=workers,
            reservations=dict(self.reservations),
            reserve_after=self.reserve_after,
            # With one user and no quotas these change nothing: skip computing them.
            usage=self.usage.usage(now, self.jobs.active()) if shared else {},
            gpu_quotas=quotas,
            groups={u.name: u.group for u in self.users.list() if u.group} if quotas else {},
        )

    def explain(self, job: Job) -> str:
        """Why the job waits, where it was placed, or how it ended, in one sentence."""
        now = self.clock.now()
        if job.state == JobState.QUEUED and job.retry_at is not None and job.retry_at > now:
            last = job.history[-1] if job.history else None
            why = f" after {last.outcome}: {last.reason}" if last and last.reason else ""
            return (
                f"job {job.id} waits {job.retry_at - now:.0f}s more before attempt "
                f"{job.attempts} (retry backoff{why})"
            )
        if job.pending is not None and job.state == JobState.QUEUED:
            if job.pending.sessions:  # how long they have been idle: as of now
                return with_sessions(job.pending, job.pending.sessions, self.clock.now()).sentence
            return job.pending.sentence
        if job.placement is not None:
            return job.placement.explanation
        if job.state == JobState.QUEUED:
            # Asked before this control plane's first pass (e.g. a fresh CLI process): the
            # scheduler is a pure function, so ask it now rather than say "not yet known". The
            # loop's cache is the thread's while a pass is in flight.
            cache = SchedulerCache() if self._inflight else self.cache
            try:
                report = schedule(self.snapshot(), cache).pending.get(job.id)
            except Exception:  # a bad worker: the next pass sets it aside
                report = None
            if report is not None:
                return report.sentence
            return f"job {job.id} is queued and about to be placed"
        return f"job {job.id} is {job.state.value}" + (f": {job.reason}" if job.reason else "")

    async def run_pass(self) -> None:
        async with self._one:
            self._pending = False
            if not self.running:
                return
            self._inflight = True
            self._last_start = asyncio.get_running_loop().time()
            began = time.perf_counter()
            try:
                await self._run_pass()
            finally:
                self._inflight = False
                self._last_took = took = time.perf_counter() - began
                if self.on_pass is not None:
                    self.on_pass(took)
                if self._pending and self.running:  # kicked while in flight
                    self._schedule_next()

    async def _run_pass(self) -> None:
        fresh, self.fresh = self.fresh, set()  # before the snapshot: each is in this pass
        plan, snapshot = await self.plan()
        self._busy = bool(snapshot.pending)
        # A pass on a thread spans loop turns: a worker may have left since its snapshot.
        live = {w.id for w in self.workers.live()} if self._threaded(snapshot) else None
        reports = plan.pending
        if self.annotate is not None:  # every pass: it also scales idle machines down
            reports = self.annotate(snapshot, plan)
        self.reservations = dict(plan.reservations)
        now = self.clock.now()
        placed: list[Change] = []
        for a in plan.assignments:
            job = self.jobs.active_job(a.job_id)
            if job is None or job.state != JobState.QUEUED:
                continue
            if live is not None and not live.issuperset(a.placement.worker_ids):
                self._pending = True  # placed again by the next pass
                continue
            # In memory now, so nothing placed twice; written below in one group commit.
            placed.append(
                self.jobs.stage(
                    job.id,
                    JobState.PLACED,
                    placement=a.placement,
                    pending=None,
                    placed_at=now,
                    retry_at=None,
                )
            )
        if placed:  # before the reports: a placement need not wait for thousands of notes
            await self._hand_out(placed)
        holds: list[SessionHold] | None = None  # the sessions holding GPUs: asked once a pass
        seen: dict[int, list[SessionHold]] = {}  # the holds on each candidate list's workers
        for n, (job_id, report) in enumerate(reports.items(), 1):
            if n % NOTE_BATCH == 0:
                await asyncio.sleep(0)  # requests waiting meanwhile go first
            job = self.jobs.active_job(job_id)
            if job is None or job.state != JobState.QUEUED or job.pending == report:
                continue
            if job_id in fresh and self._never(job, report):
                sentence = never_sentence(report, job.spec.resources)
                await self.logs.system(job_id, sentence)
                await self.jobs.commit(job_id, JobState.FAILED, reason=sentence)
                continue
            if waits_for_gpus(job, report):
                if holds is None:
                    holds = self.session_holds()
                report = with_holds(report, holds, now, seen)
            # A change of queue position alone is not announced: every finish would otherwise
            # emit one event per waiting job. Readers of the job see the current position.
            changed = job.pending is None or _reasons(job.pending) != _reasons(report)
            await self.jobs.note(job_id, announce=changed, pending=report)
        self._arm_reservation_timer(now)

    async def plan(self) -> tuple[Plan, Snapshot]:
        """One pass of the scheduler; workers whose data makes it raise are set aside first."""
        for _ in range(3):
            snapshot = self.snapshot()
            try:
                return await self._schedule(snapshot), snapshot
            except Exception as exc:
                bad = culprits(snapshot)
                if not bad:
                    raise
                for worker, why in bad:
                    log.error(
                        "worker %s set aside: a scheduling pass failed on it: %s", worker.name, why
                    )
                    await self.workers.set_aside(
                        worker.id, f"a scheduling pass failed on it: {why}"
                    )
                log.debug("scheduling pass failed", exc_info=exc)
        snapshot = self.snapshot()
        return await self._schedule(snapshot), snapshot

    def _threaded(self, snapshot: Snapshot) -> bool:
        return len(snapshot.pending) >= self.thread_above

    async def _schedule(self, snapshot: Snapshot) -> Plan:
        if self._threaded(snapshot):
            return await asyncio.to_thread(self._schedule_now, snapshot)
        return self._schedule_now(snapshot)

    def _schedule_now(self, snapshot: Snapshot) -> Plan:
        with gc_paused() if self.pause_gc else contextlib.nullcontext():
            return schedule(snapshot, self.cache)

    def _never(self, job: Job, report: PlacementReport) -> bool:
        """Fail this waiting job now: nothing here can ever run it and it did not ask to wait."""
        if job.spec.wait_for_capacity or not report.never_fits:
            return False
        named = job.spec.resources.worker
        return named is None or not self.workers.gone_named(named)

    async def _hand_out(self, placed: list[Change]) -> None:
        """Fail placements missing a secret; write the rest and give them to their workers."""
        owned = await self.secrets.for_jobs(c.after for c in placed)
        ready: list[Change] = []
        for change in placed:
            job = change.after
            known = owned.get(job.owner, {})
            missing = [n for n in job.spec.secrets if n not in known]
            if not missing:
                ready.append(change)
                continue
            await self.logs.system(job.id, f"secret(s) not set: {', '.join(missing)}")
            await self.jobs.commit(
                job.id,
                JobState.FAILED,
                reason=f"secret(s) not set on the control plane: {', '.join(missing)}; "
                "set them with `gpulayer secret set NAME`",
            )
        # One group commit carries every placement and its log line.
        await asyncio.gather(
            self.jobs.flush(ready),
            *(self.logs.system(c.after.id, _describe(c.after.placement)) for c in ready),
        )
        touched: set[str] = set()
        for change in ready:
            current = self.jobs.active_job(change.after.id)
            if current is None or current.state != JobState.PLACED:
                continue  # cancelled or lost while the write was pending
            job = current
            known = owned.get(job.owner, {})
            secrets = {n: known[n] for n in job.spec.secrets}
            touched.update(self.dispatch.assign(job, secrets))
        for wid in touched:
            self.workers.refresh(wid)

    def _arm_reservation_timer(self, now: float) -> None:
        """Run a pass when the next waiting gang job becomes old enough to reserve devices, or
        the next retried job's backoff is over.

        Nothing else may happen in the cluster at that moment, and the scheduler has no clock.
        """
        due: list[float] = []
        reserved = self.reservations
        for j in self.jobs.active():
            if j.state != _QUEUED:
                continue
            if j.retry_at is not None and j.retry_at > now:
                due.append(j.retry_at)
            if j.id not in reserved and j.spec.is_gang:
                when = j.submitted_at + self.reserve_after
                if when > now:
                    due.append(when)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due and self.running:
            self._timer = self.clock.call_later(min(due) - now + 0.01, self.kick)


def _view(
    views: Views, w: WorkerInfo, running: dict[str, list[RunningJob]], suspected: bool
) -> WorkerView:
    """The worker as the scheduler sees it; one held back takes no work but is counted."""
    if w.unschedulable is not None:
        return WorkerView(w.id, w.name, w.state, {}, SET_ASIDE, (), Reason.UNSCHEDULABLE)
    held = tuple(running.get(w.id, ()))
    hold = Reason.WORKER_SUSPECT if suspected else None
    return views.worker(
        w,
        held,
        hold,
        lambda: WorkerView(
            id=w.id,
            name=w.name,
            state=w.state,
            labels=w.labels,
            capabilities=w.capabilities,
            running=held,
            hold=hold,
        ),
    )


def _describe(p: Placement | None) -> str:
    assert p is not None
    parts = []
    for n in p.nodes:
        where = f"{n.worker_name}"
        if n.devices:
            where += f" devices {n.devices}" + (" (simulated)" if n.simulated else "")
        elif n.cpu_fallback:
            where += " on CPU (fallback)"
        parts.append(where)
    return "placed on " + ", ".join(parts)


def _reasons(report: PlacementReport) -> tuple[object, ...]:
    """What a waiting job's report says, without its queue position (nor the autoscaler's
    estimates and countdowns, which change every pass)."""
    sessions = tuple((h.session_id, h.gpus, h.idle_since is None) for h in report.sessions)
    note = report.scaling
    scaling = (note.code, note.offer, tuple(note.instances)) if note is not None else None
    return (
        report.filtered,
        report.exhausted,
        report.reserved_by,
        report.reservation,
        sessions,
        scaling,
    )


def _log_task_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("scheduling pass failed", exc_info=task.exception())
