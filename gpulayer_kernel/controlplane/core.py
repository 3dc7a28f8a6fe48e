"""The one ControlPlane (ADR 0001): jobs, workers, logs, blobs and the scheduler, in one class.

The same object runs in-process (``gpulayer run``, plain IPython, tests), inside the Jupyter server
extension, and behind ``gpulayer serve``. All state changes happen on one asyncio loop; active jobs
and workers live in memory and are written through to the MetadataStore (group-committed) before a
call returns, so a crash leaves every acknowledged change on disk.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from ..contracts import (
    Artifact,
    Event,
    EventPage,
    FinishReport,
    Job,
    JobAssignment,
    JobSpec,
    JobState,
    LogLine,
    LogPage,
    LogRecord,
    Placement,
    PlacementReport,
    Rendezvous,
    Work,
    WorkerInfo,
    WorkerRegistration,
    WorkerState,
    ensure_json,
)
from ..contracts.jobs import ENV_NAME_RE
from ..errors import Conflict, InvalidInput, NotFound
from ..redact import Redactor
from ..scheduler import JobRequest, Reservation, RunningJob, Snapshot, WorkerView, schedule
from ..store import ArtifactStore, JobQuery, MetadataStore
from .signals import Signal
from .states import check_transition

log = logging.getLogger("gpulayer.controlplane")

ACTIVE_STATES = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING)
MAX_EVENTS = 10_000
MAX_LOG_PAGE = 5_000
FINISHED_CACHE = 1_024
TAIL_CACHE = 5_000


def new_id() -> str:
    return uuid.uuid4().hex[:12]


class ControlPlane:
    """Knows every job and worker; places jobs with the pure scheduler; never polls."""

    def __init__(
        self,
        store: MetadataStore,
        artifacts: ArtifactStore,
        *,
        clock: Callable[[], float] = time.time,
        heartbeat_timeout: float = 30.0,
        reserve_after: float = 60.0,
        rendezvous_timeout: float = 120.0,
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        self.clock = clock
        self.heartbeat_timeout = heartbeat_timeout
        self.reserve_after = reserve_after
        self.rendezvous_timeout = rendezvous_timeout
        self._jobs: dict[str, Job] = {}  # active jobs (queued/placed/running) by id
        # Recently finished jobs and active jobs' log tails stay in memory: each store read is a
        # thread hop, and a job's end is exactly when every waiter reads it.
        self._finished: OrderedDict[str, Job] = OrderedDict()
        self._tails: dict[str, list[LogRecord]] = {}
        self._workers: dict[str, WorkerInfo] = {}
        self._seq = 0
        self._log_seq: dict[str, int] = {}
        self._job_signals: dict[str, Signal] = {}
        self._worker_signals: dict[str, Signal] = {}
        self._inbox: dict[str, list[JobAssignment]] = {}
        self._cancels: dict[str, set[str]] = {}
        self._reservations: dict[str, Reservation] = {}
        self._rendezvous: dict[str, Rendezvous] = {}
        self._nodes_done: dict[str, set[str]] = {}
        self._events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self._event_seq = 0
        self._event_signal = Signal()
        self._schedule_pending = False
        self._reaper: asyncio.Task[None] | None = None
        self._reserve_timer: asyncio.TimerHandle | None = None
        self._started = False
        self.redactor = Redactor()

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load active jobs and known workers; workers of a dead in-process host are lost."""
        self._seq = await self.store.max_job_seq()
        for job in await self.store.list_jobs(JobQuery(states=ACTIVE_STATES, limit=1_000_000)):
            self._jobs[job.id] = job
        now = self.clock()
        for w in await self.store.load_workers():
            if w.state in (WorkerState.LOST, WorkerState.OFFLINE):
                continue
            if w.transport == "inprocess":
                # In-process workers die with their host process: this one is gone for good.
                self._workers[w.id] = w
                await self._lose_worker(w.id, "its host process stopped")
            else:
                # Remote workers get one heartbeat period to reconnect after a restart.
                self._workers[w.id] = w.model_copy(update={"last_heartbeat": now})
        for job in list(self._jobs.values()):
            # A placed or running job whose worker is gone (lost, offline or never seen again)
            # would otherwise stay placed forever: the reaper only watches live workers.
            if job.placement is None or job.state == JobState.QUEUED:
                continue
            gone = [
                wid
                for wid in job.placement.worker_ids
                if wid not in self._workers
                or self._workers[wid].state in (WorkerState.LOST, WorkerState.OFFLINE)
            ]
            if gone:
                reason = "its worker was gone when the control plane restarted"
                await self._system_log(job.id, reason)
                if self._may_retry(job):
                    await self._retry(job, reason)
                else:
                    await self._transition(job, JobState.LOST, reason=reason)
        for name, value in (await self._secret_values()).items():
            self.redactor.add(name, value)
        await self._redeliver_placed()
        self._started = True
        self._reaper = asyncio.create_task(self._reap_loop())
        self._kick()

    async def close(self) -> None:
        self._started = False
        if self._reserve_timer is not None:
            self._reserve_timer.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for sig in [*self._job_signals.values(), *self._worker_signals.values()]:
            sig.fire()
        self._event_signal.fire()

    async def _secret_values(self) -> dict[str, str]:
        names = await self.store.list_secret_names()
        return await self.store.get_secrets(names)

    # -- client side -----------------------------------------------------------------------------

    async def submit(self, spec: JobSpec) -> Job:
        """Queue a job. A Python workload's bundle must already be uploaded."""
        if spec.workload.kind == "python" and not self.artifacts.has(spec.workload.bundle):
            raise NotFound(
                f"bundle {spec.workload.bundle[:12]}… has not been uploaded",
                hint="upload it with put_bundle (the client and magic do this for you)",
                details={"bundle": spec.workload.bundle},
                code="bundle_not_found",
            )
        self._seq += 1
        job = Job(id=new_id(), seq=self._seq, spec=spec, submitted_at=self.clock())
        self._jobs[job.id] = job
        self._log_seq[job.id] = 0
        self._tails[job.id] = []
        await self.store.save_jobs([job])
        self._job_event(job)
        self._kick()
        return job

    async def resolve(self, job_id: str) -> str:
        """Accept a unique id prefix (at least 4 characters), as git does."""
        if job_id in self._jobs or job_id in self._finished:
            return job_id
        if len(job_id) < 4:
            raise InvalidInput(
                f"job id {job_id!r} is too short", hint="give at least 4 characters of the id"
            )
        ids = [i for i in self._jobs if i.startswith(job_id)] or await self.store.find_job_ids(
            job_id
        )
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

    async def get(self, job_id: str) -> Job:
        job_id = await self.resolve(job_id)
        job = self._jobs.get(job_id) or self._finished.get(job_id)
        if job is None:
            job = await self.store.get_job(job_id)
        if job is None:  # pragma: no cover - resolve() found it
            raise NotFound(f"no job {job_id!r}", code="job_not_found")
        return job

    async def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        if not 1 <= limit <= 10_000:
            raise InvalidInput("limit must be between 1 and 10000", details={"limit": limit})
        jobs = await self.store.list_jobs(
            JobQuery(states=tuple(states), name=name, label=label, limit=limit)
        )
        # The store has every state change; active jobs also carry their live pending report.
        return [self._jobs.get(j.id, j) for j in jobs]

    async def cancel(self, job_id: str, reason: str = "cancelled by user") -> Job:
        job = await self.get(job_id)
        if job.state.terminal:
            return job
        if job.state == JobState.QUEUED:
            job = await self._transition(job, JobState.CANCELLED, reason=reason)
            await self._system_log(job.id, reason)
            return job
        # Placed or running: the worker stops the process group and reports back.
        job = await self._update(job, cancel_requested=True, reason=reason)
        assert job.placement is not None
        self._stop_on_workers(job)
        await self._system_log(job.id, f"{reason}; stopping its processes")
        return job

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Return when the job reaches a final state (or at ``timeout`` with its current state)."""
        job_id = await self.resolve(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.get(job_id)
            if job.state.terminal:
                return job
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return job
            await self._job_signal(job_id).wait(left)

    async def logs(
        self, job_id: str, since: int = 0, wait: float = 0.0, limit: int = 1000
    ) -> LogPage:
        """Log records after ``since``; with ``wait`` > 0, long-poll until one arrives."""
        job_id = await self.resolve(job_id)
        limit = max(1, min(limit, MAX_LOG_PAGE))
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            job = await self.get(job_id)
            records = await self._read_logs(job_id, since, limit)
            left = deadline - time.monotonic()
            if records or job.state.terminal or left <= 0:
                next_since = records[-1].seq if records else since
                return LogPage(
                    job_id=job_id, records=records, next_since=next_since, state=job.state
                )
            await self._job_signal(job_id).wait(left)

    async def _read_logs(self, job_id: str, since: int, limit: int) -> builtins.list[LogRecord]:
        tail = self._tails.get(job_id)
        if tail is not None and (not tail or tail[0].seq <= since + 1):
            start = max(0, since - tail[0].seq + 1) if tail else 0
            return tail[start : start + limit]
        return await self.store.read_logs(job_id, since, limit)

    async def explain(self, job_id: str) -> str:
        job = await self.get(job_id)
        if job.pending is not None and job.state == JobState.QUEUED:
            return job.pending.sentence
        if job.placement is not None:
            return job.placement.explanation
        if job.state == JobState.QUEUED:
            # Asked before this control plane's first pass (e.g. a fresh CLI process): the
            # scheduler is a pure function, so ask it now rather than say "not yet known".
            report = schedule(self.snapshot()).pending.get(job.id)
            if report is not None:
                return report.sentence
            return f"job {job.id} is queued and about to be placed"
        return f"job {job.id} is {job.state.value}" + (f": {job.reason}" if job.reason else "")

    async def workers(self) -> builtins.list[WorkerInfo]:
        return sorted(self._workers.values(), key=lambda w: (w.name, w.id))

    async def events(self, since: int = 0, wait: float = 0.0) -> EventPage:
        """Job and worker changes after ``since`` (long-poll with ``wait``), for UIs."""
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            oldest = self._events[0].seq if self._events else self._event_seq + 1
            # Reset: the events after `since` are gone (dropped from the ring), or `since` is from
            # before a restart (numbers start again): the client refetches its lists.
            reset = (since < oldest - 1 and since != 0 and bool(self._events)) or (
                since > self._event_seq
            )
            events = [e for e in self._events if e.seq > since] if self._event_seq > since else []
            left = deadline - time.monotonic()
            if events or reset or left <= 0 or not self._started:
                return EventPage(events=events, next_since=self._event_seq, reset=reset)
            await self._event_signal.wait(left)

    # blobs: bundles and artifacts share one content-addressed store

    async def put_blob(self, data: bytes, digest: str | None = None) -> str:
        return await asyncio.to_thread(self.artifacts.put, data, digest)

    async def has_blob(self, digest: str) -> bool:
        return self.artifacts.has(digest)

    async def get_blob(self, digest: str) -> bytes:
        return await asyncio.to_thread(self.artifacts.get, digest)

    put_bundle = put_blob
    has_bundle = has_blob
    get_bundle = get_blob

    # secrets: stored here, resolved for the worker at assignment, never returned by a read API

    async def set_secret(self, name: str, value: str) -> None:
        if not ENV_NAME_RE.match(name):
            raise InvalidInput(
                f"{name!r} is not a valid secret name",
                hint="secret names are environment variable names: letters, digits and _",
                details={"name": name},
            )
        await self.store.set_secret(name, value)
        self.redactor.add(name, value)

    async def secret_names(self) -> builtins.list[str]:
        return await self.store.list_secret_names()

    async def delete_secret(self, name: str) -> bool:
        return await self.store.delete_secret(name)

    # -- worker side -----------------------------------------------------------------------------

    async def register(self, reg: WorkerRegistration, worker_id: str | None = None) -> WorkerInfo:
        """Enrol a worker (or re-enrol one after a restart, keeping its id)."""
        now = self.clock()
        old = self._workers.get(worker_id) if worker_id else None
        info = WorkerInfo(
            id=worker_id or new_id(),
            name=reg.name,
            labels=reg.labels,
            capabilities=reg.capabilities,
            address=reg.address,
            transport=reg.transport,
            registered_at=old.registered_at if old else now,
            last_heartbeat=now,
            state=old.state
            if old and old.state in (WorkerState.CORDONED, WorkerState.DRAINING)
            else WorkerState.READY,
        )
        self._workers[info.id] = self._with_usage(info)
        await self.store.save_workers([self._workers[info.id]])
        self._worker_event(info.id)
        self._kick()
        return self._workers[info.id]

    def _worker(self, worker_id: str) -> WorkerInfo:
        w = self._workers.get(worker_id)
        if w is None or w.state == WorkerState.LOST:
            raise NotFound(
                f"worker {worker_id} is not registered (or was declared lost)",
                hint="the worker must join again",
                code="worker_not_found",
            )
        return w

    async def heartbeat(self, worker_id: str) -> WorkerInfo:
        w = self._worker(worker_id)
        self._workers[worker_id] = w.model_copy(update={"last_heartbeat": self.clock()})
        return self._workers[worker_id]

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> WorkerInfo:
        """Cordon (no new work), drain (no new work; finishes what it has) or make ready."""
        if state not in (WorkerState.READY, WorkerState.CORDONED, WorkerState.DRAINING):
            raise InvalidInput(f"a worker cannot be set to {state.value}")
        w = self._worker(worker_id)
        self._workers[worker_id] = self._with_usage(w.model_copy(update={"state": state}))
        await self.store.save_workers([self._workers[worker_id]])
        self._worker_event(worker_id)
        self._kick()
        return self._workers[worker_id]

    async def next_work(self, worker_id: str, wait: float = 0.0) -> Work:
        """Long-poll for new assignments and cancellations; answers the moment one exists."""
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            await self.heartbeat(worker_id)
            inbox = self._inbox.pop(worker_id, [])
            cancels = self._cancels.pop(worker_id, set())
            left = deadline - time.monotonic()
            if inbox or cancels or left <= 0 or not self._started:
                return Work(assignments=inbox, cancel=sorted(cancels))
            await self._worker_signal(worker_id).wait(left)

    def _owned(self, worker_id: str, job_id: str) -> Job:
        self._worker(worker_id)
        job = self._jobs.get(job_id)
        if job is None or job.placement is None or worker_id not in job.placement.worker_ids:
            raise Conflict(
                f"job {job_id} is not running on worker {worker_id}",
                hint="the job may have been cancelled, lost or reassigned",
                code="not_assigned",
            )
        return job

    async def report_started(self, worker_id: str, job_id: str) -> Job:
        job = self._owned(worker_id, job_id)
        if job.state == JobState.PLACED:
            job = await self._transition(job, JobState.RUNNING, started_at=self.clock())
        return job

    async def append_logs(self, worker_id: str, job_id: str, lines: builtins.list[LogLine]) -> int:
        self._owned(worker_id, job_id)
        return await self._append_logs(job_id, lines)

    async def report_progress(self, worker_id: str, job_id: str, fields: dict[str, Any]) -> None:
        job = self._owned(worker_id, job_id)
        ensure_json(fields, "progress")
        self._jobs[job_id] = job.model_copy(update={"progress": fields})
        self._job_event(self._jobs[job_id])
        self._job_signal(job_id).fire()

    async def report_finished(self, worker_id: str, job_id: str, report: FinishReport) -> Job:
        """Record a job's outcome. Idempotent: a second report of a finished job changes nothing."""
        job = self._jobs.get(job_id)
        if job is None:
            stored = await self.store.get_job(job_id)
            if stored is not None and stored.state.terminal:
                return stored  # a retried report after a reconnect: recorded once already
        job = self._owned(worker_id, job_id)
        assert job.placement is not None
        if len(job.placement.nodes) > 1:
            return await self._node_finished(worker_id, job, report)
        return await self._finish(job, report)

    async def _finish(self, job: Job, report: FinishReport) -> Job:
        state = JobState(report.state)
        if job.cancel_requested and state != JobState.SUCCEEDED:
            state = JobState.CANCELLED
        artifacts = [*job.artifacts, *report.artifacts]
        if state == JobState.FAILED and self._may_retry(job):
            return await self._retry(job, report.reason or f"exit code {report.exit_code}")
        job = await self._transition(
            job,
            state,
            exit_code=report.exit_code,
            reason=job.reason if state == JobState.CANCELLED else report.reason,
            result=report.result,
            artifacts=artifacts,
            finished_at=self.clock(),
        )
        return job

    async def _node_finished(self, worker_id: str, job: Job, report: FinishReport) -> Job:
        """A multi-node gang: the first failing node fails the job and stops the others."""
        assert job.placement is not None
        node = next(n for n in job.placement.nodes if n.worker_id == worker_id)
        if report.state != "succeeded":
            self._nodes_done.pop(job.id, None)
            self._stop_on_workers(job, but=worker_id)
            reason = f"node {node.node_rank} ({node.worker_name}): {report.reason or 'failed'}"
            return await self._finish(job, report.model_copy(update={"reason": reason}))
        node_ids = job.placement.worker_ids
        done = self._nodes_done.setdefault(job.id, set())
        done.add(worker_id)
        update: dict[str, Any] = {"artifacts": [*job.artifacts, *report.artifacts]}
        if node.node_rank == 0:
            update["result"] = report.result  # rank 0's result is the job's
        job = job.model_copy(update=update)
        self._jobs[job.id] = job
        if len(done) < len(node_ids):
            return job
        self._nodes_done.pop(job.id, None)
        return await self._finish(
            job, report.model_copy(update={"artifacts": [], "result": job.result})
        )

    async def publish_rendezvous(self, worker_id: str, job_id: str, rdzv: Rendezvous) -> None:
        self._owned(worker_id, job_id)
        self._rendezvous[job_id] = rdzv
        self._job_signal(job_id).fire()

    async def get_rendezvous(self, worker_id: str, job_id: str, wait: float = 0.0) -> Rendezvous:
        """Long-poll for the rank-0 worker's rendezvous record (no sleeps)."""
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            job = self._owned(worker_id, job_id)
            if job_id in self._rendezvous:
                return self._rendezvous[job_id]
            left = deadline - time.monotonic()
            if left <= 0 or job.state.terminal or job.cancel_requested:
                raise Conflict(
                    f"no rendezvous for job {job_id} yet",
                    hint="the rank-0 worker has not published its address",
                    code="rendezvous_pending",
                )
            await self._job_signal(job_id).wait(left)

    async def deregister(self, worker_id: str) -> None:
        """A clean worker exit: its unfinished jobs are lost (or requeued if they may retry)."""
        if worker_id in self._workers:
            await self._lose_worker(worker_id, "its worker shut down", WorkerState.OFFLINE)

    # -- internals -------------------------------------------------------------------------------

    def _job_signal(self, job_id: str) -> Signal:
        return self._job_signals.setdefault(job_id, Signal())

    def _worker_signal(self, worker_id: str) -> Signal:
        return self._worker_signals.setdefault(worker_id, Signal())

    def _wake_worker(self, worker_id: str) -> None:
        self._worker_signal(worker_id).fire()

    def _stop_on_workers(self, job: Job, but: str | None = None) -> None:
        """Tell every worker holding a part of ``job`` (except ``but``) to stop it, now."""
        assert job.placement is not None
        for worker_id in job.placement.worker_ids:
            if worker_id != but:
                self._cancels.setdefault(worker_id, set()).add(job.id)
                self._wake_worker(worker_id)

    def _emit(self, event: Event) -> None:
        self._events.append(event)
        self._event_signal.fire()

    def _job_event(self, job: Job) -> None:
        self._event_seq += 1
        self._emit(Event(seq=self._event_seq, time=self.clock(), kind="job", job=job))

    def _worker_event(self, worker_id: str) -> None:
        self._event_seq += 1
        w = self._workers[worker_id]
        self._emit(Event(seq=self._event_seq, time=self.clock(), kind="worker", worker=w))

    async def _update(self, job: Job, **fields: Any) -> Job:
        job = job.model_copy(update=fields)
        if job.state.terminal:
            self._jobs.pop(job.id, None)
            self._tails.pop(job.id, None)
            self._finished[job.id] = job
            while len(self._finished) > FINISHED_CACHE:
                self._finished.popitem(last=False)
        else:
            self._jobs[job.id] = job
        await self.store.save_jobs([job])
        self._job_event(job)
        self._job_signal(job.id).fire()
        return job

    async def _transition(self, job: Job, target: JobState, **fields: Any) -> Job:
        check_transition(job.id, job.state, target)
        old_workers = job.placement.worker_ids if job.placement else []
        if target != JobState.QUEUED and target.terminal:
            fields.setdefault("finished_at", self.clock())
        job = await self._update(job, state=target, **fields)
        if target.terminal or target == JobState.QUEUED:
            self._rendezvous.pop(job.id, None)
            for wid in old_workers:
                if wid in self._workers:
                    self._workers[wid] = self._with_usage(self._workers[wid])
                    self._worker_event(wid)
            if target.terminal:
                self._log_seq.pop(job.id, None)
                # Late waiters still find the final state in the store; drop the signal.
                sig = self._job_signals.pop(job.id, None)
                if sig is not None:
                    sig.fire()
            self._kick()
        return job

    def _may_retry(self, job: Job) -> bool:
        # A gang job is never retried automatically: one failed rank usually means all fail again.
        return not job.spec.is_gang and job.attempts < job.spec.retries

    async def _retry(self, job: Job, why: str) -> Job:
        attempt = job.attempts + 1
        await self._system_log(
            job.id, f"attempt {attempt} failed ({why}); retrying ({attempt}/{job.spec.retries})"
        )
        return await self._transition(
            job,
            JobState.QUEUED,
            attempts=attempt,
            placement=None,
            cancel_requested=False,
            exit_code=None,
            started_at=None,
            placed_at=None,
            progress=None,
        )

    async def _system_log(self, job_id: str, text: str) -> None:
        await self._append_logs(job_id, [LogLine(time=self.clock(), stream="system", text=text)])

    async def _append_logs(self, job_id: str, lines: builtins.list[LogLine]) -> int:
        if not lines:
            return self._log_seq.get(job_id, 0)
        if job_id not in self._log_seq:
            self._log_seq[job_id] = await self.store.max_log_seq(job_id)
        seq = self._log_seq[job_id]
        records = []
        redact = self.redactor.redact
        for line in lines:
            seq += 1
            # Second layer of redaction: workers redact first; a missed value stops here.
            records.append(
                LogRecord.model_construct(
                    seq=seq,
                    time=line.time,
                    stream=line.stream,
                    rank=line.rank,
                    text=redact(line.text),
                )
            )
        self._log_seq[job_id] = seq
        tail = self._tails.get(job_id)
        if tail is not None:
            tail.extend(records)
            if len(tail) > TAIL_CACHE:
                del tail[: len(tail) - TAIL_CACHE]
        await self.store.append_logs(job_id, records)
        self._job_signal(job_id).fire()
        return seq

    def _with_usage(self, w: WorkerInfo) -> WorkerInfo:
        running: builtins.list[str] = []
        device_jobs: dict[int, str] = {}
        for job in self._jobs.values():
            if job.placement is None or job.state not in (JobState.PLACED, JobState.RUNNING):
                continue
            for node in job.placement.nodes:
                if node.worker_id == w.id:
                    running.append(job.id)
                    for d in node.devices:
                        device_jobs[d] = job.id
        state = w.state
        if state in (WorkerState.READY, WorkerState.BUSY):
            state = WorkerState.BUSY if running else WorkerState.READY
        return w.model_copy(
            update={"running": sorted(running), "device_jobs": device_jobs, "state": state}
        )

    async def _lose_worker(
        self, worker_id: str, why: str, state: WorkerState = WorkerState.LOST
    ) -> None:
        w = self._workers[worker_id].model_copy(update={"state": state})
        self._workers[worker_id] = w
        self._inbox.pop(worker_id, None)
        self._cancels.pop(worker_id, None)
        for job in list(self._jobs.values()):
            if job.placement is None or worker_id not in job.placement.worker_ids:
                continue
            if job.state not in (JobState.PLACED, JobState.RUNNING):
                continue
            self._stop_on_workers(job, but=worker_id)  # the rest of a multi-node gang
            reason = f"worker {w.name} was lost: {why}"
            if job.cancel_requested:
                await self._transition(job, JobState.CANCELLED, reason=job.reason)
            elif self._may_retry(job):
                await self._retry(job, reason)
            else:
                await self._system_log(job.id, reason)
                await self._transition(job, JobState.LOST, reason=reason)
        self._workers[worker_id] = self._with_usage(w)
        if state != WorkerState.LOST:
            self._workers[worker_id] = self._workers[worker_id].model_copy(update={"state": state})
        await self.store.save_workers([self._workers[worker_id]])
        self._worker_event(worker_id)
        self._wake_worker(worker_id)
        self._kick()

    async def _reap_loop(self) -> None:
        # Not a hot path: a worker that stops answering is noticed within a quarter period.
        period = max(0.05, min(5.0, self.heartbeat_timeout / 4))
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            for w in list(self._workers.values()):
                if w.state in (WorkerState.LOST, WorkerState.OFFLINE):
                    continue
                if now - w.last_heartbeat > self.heartbeat_timeout:
                    log.warning(
                        "worker %s lost: no heartbeat for %.1fs", w.name, now - w.last_heartbeat
                    )
                    await self._lose_worker(w.id, f"no heartbeat for {now - w.last_heartbeat:.1f}s")
            await self._check_rendezvous(now)

    async def _check_rendezvous(self, now: float) -> None:
        for job in list(self._jobs.values()):
            if (
                job.placement is not None
                and len(job.placement.nodes) > 1
                and job.id not in self._rendezvous
                and job.placed_at is not None
                and now - job.placed_at > self.rendezvous_timeout
                and not job.cancel_requested
            ):
                reason = (
                    f"rendezvous did not complete within {self.rendezvous_timeout:g}s: the "
                    "rank-0 worker never published its address"
                )
                # Fail (not cancel) the gang at once, as _node_finished does: a cancel would
                # leave the job placed until every worker reported, and call it "cancelled".
                self._stop_on_workers(job)
                await self._system_log(job.id, reason)
                await self._transition(job, JobState.FAILED, reason=reason)

    # -- scheduling ------------------------------------------------------------------------------

    def _kick(self) -> None:
        """Run a scheduling pass soon; several changes in one loop turn share one pass."""
        if self._schedule_pending or not self._started:
            return
        self._schedule_pending = True
        asyncio.get_running_loop().call_soon(self._start_pass)

    def _start_pass(self) -> None:
        task = asyncio.create_task(self._schedule_pass())
        task.add_done_callback(_log_task_error)

    def snapshot(self) -> Snapshot:
        now = self.clock()
        running: dict[str, list[RunningJob]] = {}
        pending: builtins.list[JobRequest] = []
        for job in self._jobs.values():
            if job.state == JobState.QUEUED:
                pending.append(
                    JobRequest(
                        id=job.id,
                        seq=job.seq,
                        priority=job.spec.priority,
                        resources=job.spec.resources,
                        submitted_at=job.submitted_at,
                        timeout=job.spec.timeout,
                    )
                )
            elif job.placement is not None:
                start = job.started_at or job.placed_at or now
                ends_by = start + job.spec.timeout if job.spec.timeout else None
                for node in job.placement.nodes:
                    running.setdefault(node.worker_id, []).append(
                        RunningJob(
                            id=job.id,
                            devices=tuple(node.devices),
                            cpus=job.spec.resources.cpus or 0.0,
                            ends_by=ends_by,
                        )
                    )
        workers = tuple(
            WorkerView(
                id=w.id,
                name=w.name,
                state=w.state,
                labels=w.labels,
                capabilities=w.capabilities,
                running=tuple(running.get(w.id, ())),
            )
            for w in self._workers.values()
            if w.state not in (WorkerState.LOST, WorkerState.OFFLINE)
        )
        return Snapshot(
            now=now,
            pending=tuple(pending),
            workers=workers,
            reservations=dict(self._reservations),
            reserve_after=self.reserve_after,
        )

    async def _schedule_pass(self) -> None:
        self._schedule_pending = False
        if not self._started:
            return
        plan = schedule(self.snapshot())
        self._reservations = dict(plan.reservations)
        now = self.clock()
        placed: builtins.list[Job] = []
        touched_workers: set[str] = set()
        for a in plan.assignments:
            job = self._jobs.get(a.job_id)
            if job is None or job.state != JobState.QUEUED:
                continue
            check_transition(job.id, job.state, JobState.PLACED)
            job = job.model_copy(
                update={
                    "state": JobState.PLACED,
                    "placement": a.placement,
                    "pending": None,
                    "placed_at": now,
                }
            )
            self._jobs[job.id] = job
            placed.append(job)
        for job_id, report in plan.pending.items():
            job = self._jobs.get(job_id)
            if job is None or job.state != JobState.QUEUED or job.pending == report:
                continue
            # Pending reports are recomputed every pass; they live in memory, not the store.
            self._jobs[job_id] = job.model_copy(update={"pending": report})
            # A change of queue position alone is not announced: every finish would otherwise
            # emit one event per waiting job. Readers of the job see the current position.
            if job.pending is None or _reasons(job.pending) != _reasons(report):
                self._job_event(self._jobs[job_id])
                self._job_signal(job_id).fire()
        self._plan_reservation_pass(now)
        if not placed:
            return
        names = sorted({n for job in placed for n in job.spec.secrets})
        known = await self.store.get_secrets(names) if names else {}
        ready: builtins.list[Job] = []
        for job in placed:
            missing = [n for n in job.spec.secrets if n not in known]
            if missing:
                await self._system_log(job.id, f"secret(s) not set: {', '.join(missing)}")
                await self._transition(
                    self._jobs[job.id],
                    JobState.FAILED,
                    reason=f"secret(s) not set on the control plane: {', '.join(missing)}; "
                    "set them with `gpulayer secret set NAME`",
                )
            else:
                ready.append(job)
        # One group commit carries every placement and its log line.
        await asyncio.gather(
            self.store.save_jobs(ready),
            *(self._system_log(j.id, _describe(j.placement)) for j in ready if j.placement),
        )
        for job in ready:
            assert job.placement is not None
            secrets = {n: known[n] for n in job.spec.secrets}
            for node in job.placement.nodes:
                self._inbox.setdefault(node.worker_id, []).append(
                    JobAssignment(
                        job=job, node=node, nnodes=len(job.placement.nodes), secrets=secrets
                    )
                )
                touched_workers.add(node.worker_id)
            self._job_event(job)
            self._job_signal(job.id).fire()
        for wid in touched_workers:
            if wid in self._workers:
                self._workers[wid] = self._with_usage(self._workers[wid])
                self._worker_event(wid)
            self._wake_worker(wid)

    # -- for the HTTP API (ADR 0003) -------------------------------------------------------------

    async def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (for ``GET /status``)."""
        return await self.store.count_jobs()

    def return_work(self, worker_id: str, work: Work) -> None:
        """Put undelivered work back (its long-poll's client left before the answer went out)."""
        if worker_id not in self._workers:
            return
        inbox = self._inbox.setdefault(worker_id, [])
        inbox[:0] = [a for a in work.assignments if a.job.id in self._jobs]
        if work.cancel:
            self._cancels.setdefault(worker_id, set()).update(work.cancel)
        self._wake_worker(worker_id)

    async def _redeliver_placed(self) -> None:
        """After a restart, hand placed-but-not-started jobs to their workers again.

        Assignments wait in memory, so a restart between placement and delivery would leave the
        job placed forever; a worker that already runs it ignores the duplicate.
        """
        for job in list(self._jobs.values()):
            if job.state != JobState.PLACED or job.placement is None:
                continue
            if not all(wid in self._workers for wid in job.placement.worker_ids):
                continue
            secrets = await self.store.get_secrets(job.spec.secrets)
            for node in job.placement.nodes:
                self._inbox.setdefault(node.worker_id, []).append(
                    JobAssignment(
                        job=job, node=node, nnodes=len(job.placement.nodes), secrets=secrets
                    )
                )

    def _plan_reservation_pass(self, now: float) -> None:
        """Run a pass when the next waiting gang job becomes old enough to reserve devices.

        Nothing else may happen in the cluster at that moment, and the scheduler has no clock.
        """
        due = [
            j.submitted_at + self.reserve_after
            for j in self._jobs.values()
            if j.state == JobState.QUEUED and j.spec.is_gang and j.id not in self._reservations
        ]
        due = [t for t in due if t > now]
        if self._reserve_timer is not None:
            self._reserve_timer.cancel()
            self._reserve_timer = None
        if due and self._started:
            delay = min(due) - now + 0.01
            self._reserve_timer = asyncio.get_running_loop().call_later(delay, self._kick)

    async def artifact_for(self, job_id: str, name: str) -> Artifact:
        job = await self.get(job_id)
        for a in job.artifacts:
            if a.name == name:
                return a
        raise NotFound(
            f"job {job.id} has no artifact {name!r}",
            hint="list them with `gpulayer show JOB`",
            code="artifact_not_found",
        )


def _describe(p: Placement) -> str:
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
    """What a waiting job's report says, without its queue position."""
    return (report.filtered, report.exhausted, report.reserved_by, report.reservation)


def _log_task_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("scheduling pass failed", exc_info=task.exception())
