"""The ControlPlane's worker side (ADR 0003): what a worker agent calls — join, poll for work,
report its jobs and cells, rendezvous, leave — a service given, in its constructor, only the parts
it works with (``wiring.py`` builds them). ``ControlPlane`` offers its calls as its own; it
changes with the worker protocol.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..contracts import (
    CellReport,
    FinishReport,
    Job,
    JobReport,
    JobState,
    LogLine,
    Rendezvous,
    SessionReport,
    Work,
    WorkerInfo,
    WorkerRegistration,
    WorkerState,
    ensure_json,
)
from ..errors import Conflict, GPUlayerError
from .jobs import new_id

if TYPE_CHECKING:
    from ..clock import Clock
    from ..store import MetadataStore
    from .dispatch import Dispatcher
    from .inline import InlineBundles
    from .jobs import JobTable
    from .logs import LogTails
    from .outcomes import Outcomes
    from .provisioning.part import Provisioning
    from .reports import Reports
    from .scheduling import SchedulingLoop
    from .sessions.table import SessionTable
    from .workers import WorkerRegistry


Lose = Callable[[str, str, WorkerState], Awaitable[None]]


class WorkerCalls:
    """The calls of the worker protocol."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: MetadataStore,
        dispatch: Dispatcher,
        inline: InlineBundles,
        jobs: JobTable,
        tails: LogTails,
        outcomes: Outcomes,
        provisioning: Provisioning,
        reports: Reports,
        scheduling: SchedulingLoop,
        sessions: SessionTable,
        registry: WorkerRegistry,
        lose: Lose,
    ) -> None:
        self.clock = clock
        self.store = store
        self.dispatch = dispatch
        self.inline = inline
        self.jobs = jobs
        self.tails = tails
        self.outcomes = outcomes
        self.provisioning = provisioning
        self.reports = reports
        self.scheduling = scheduling
        self.sessions = sessions
        self.registry = registry
        self._lose_worker = lose  # the wiring's: a worker gone, and what follows

    async def register(
        self,
        reg: WorkerRegistration,
        worker_id: str | None = None,
        *,
        instance_token: str | None = None,
    ) -> WorkerInfo:
        """Enrol a worker (or re-enrol one after a restart, keeping its id); one that joined with
        an instance token (its id) is the worker of that provider instance."""
        if instance_token is not None:
            worker_id = worker_id or new_id()  # linked to its instance before it can take work
            self.provisioning.joining(instance_token, worker_id, reg.name)
        info = await self.registry.register(reg, worker_id)
        self.scheduling.kick()
        return info

    async def heartbeat(self, worker_id: str) -> WorkerInfo:
        return self.registry.heartbeat(worker_id)

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> WorkerInfo:
        """Cordon (no new work), drain (no new work; finishes what it has) or make ready."""
        info = await self.registry.set_state(worker_id, state)
        self.scheduling.kick()
        return info

    async def next_work(
        self, worker_id: str, wait: float = 0.0, *, inline_bundles: bool = False
    ) -> Work:
        """Long-poll for new assignments and cancellations; answers the moment one exists.
        ``inline_bundles`` (a protocol 1.1 worker): with the small bundles of its assignments."""
        self.registry.polling(worker_id, +1)
        try:
            work = await self.dispatch.next_work(
                worker_id, wait, lambda: self.registry.heartbeat(worker_id)
            )
        finally:
            self.registry.polling(worker_id, -1)
        if inline_bundles and work.assignments:
            work = await self.inline.attach(work)
        return work

    def worker_disconnected(self, worker_id: str) -> None:
        """The worker's long-poll connection closed unanswered: suspect it unless it calls again
        within ``registry.suspect_grace`` seconds (then no new work goes to it)."""
        self.registry.disconnected(worker_id)

    def _owned(self, worker_id: str, job_id: str, attempt: int | None = None) -> Job:
        """The active job a worker reports on, if that worker (known, not lost) holds part of it
        and ``attempt`` is current (else 409 ``stale_attempt``: see ``Outcomes.held``)."""
        return self.outcomes.held(worker_id, job_id, attempt)

    def was_given(self, worker_id: str, job_id: str) -> bool:
        """Whether the worker holds, or was handed, some attempt of the job (a report on a stale
        one is then answered ``stale_attempt``, not "not your job")."""
        job = self.jobs.cached(job_id)
        if job is not None and job.placement is not None and worker_id in job.placement.worker_ids:
            return True
        return self.dispatch.was_given(job_id, worker_id)

    async def report_started(self, worker_id: str, job_id: str, attempt: int | None = None) -> Job:
        job = self._owned(worker_id, job_id, attempt)
        self.dispatch.started(job_id, worker_id, job.attempts)  # never again to it
        if job.state == JobState.PLACED:
            job = await self.jobs.commit(job_id, JobState.RUNNING, started_at=self.clock.now())
        return job

    async def append_logs(
        self,
        worker_id: str,
        job_id: str,
        lines: builtins.list[LogLine],
        attempt: int | None = None,
    ) -> int:
        self._owned(worker_id, job_id, attempt)
        # A refused request is sent again (a 503 is retried): nothing to keep for it.
        return await self.tails.append(job_id, lines, keep=False)

    async def report_progress(
        self, worker_id: str, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None:
        self._owned(worker_id, job_id, attempt)
        ensure_json(fields, "progress")
        await self.jobs.note(job_id, progress=fields)  # masked in the job table's commit path

    async def report_finished(self, worker_id: str, job_id: str, report: FinishReport) -> Job:
        """Record a job's outcome. Idempotent: a second report of a finished job changes nothing."""
        entry = JobReport.model_construct(
            job_id=job_id,
            attempt=report.attempt,
            started=False,
            lines=[],
            progress=None,
            finished=report,
        )
        return await self.reports.finish(worker_id, entry)

    async def report(
        self, worker_id: str, reports: Sequence[JobReport]
    ) -> builtins.list[GPUlayerError | None]:
        """Protocol 1.1: several attempts' reports at once (started, lines, progress, end: a
        short job's start is written with its end); each entry's refusal, or None.

        A report is a sign of life: a worker busy shipping a flood of log lines on a loaded
        machine is alive whether or not its heartbeat is late (``registry.reported``)."""
        self.registry.reported(worker_id)
        return await self.reports.apply(worker_id, reports)

    async def report_cell(self, worker_id: str, job_id: str, report: CellReport) -> None:
        """A session cell's end on one worker's ranks (idempotent: a repeat changes nothing)."""
        job = self._owned(worker_id, job_id, report.attempt)
        if report.outputs_blob is not None:  # the cell's --out values are its owner's to read
            await self.store.add_blob_owners([(report.outputs_blob, job.owner)])
        await self.sessions.report_cell(worker_id, job, report)

    async def report_session(self, worker_id: str, job_id: str, report: SessionReport) -> None:
        job = self._owned(worker_id, job_id, report.attempt)
        await self.sessions.report_session(worker_id, job, report)

    async def publish_rendezvous(self, worker_id: str, job_id: str, rdzv: Rendezvous) -> None:
        self._owned(worker_id, job_id, rdzv.attempt)
        self.dispatch.publish(job_id, rdzv)

    async def get_rendezvous(self, worker_id: str, job_id: str, wait: float = 0.0) -> Rendezvous:
        """Long-poll for the rank-0 worker's rendezvous record (no sleeps)."""
        return await self.dispatch.rendezvous(job_id, wait, lambda: self._owned(worker_id, job_id))

    async def remove_worker(self, ref: str, *, force: bool = False) -> WorkerInfo:
        """Forget a worker (by id or name) here and in the store; returns it as it was.

        A worker that is gone (lost, offline) just goes. One still in service that holds jobs is
        refused (409 ``worker_busy``) unless ``force``: then it is taken out of service first,
        as if lost (its placed jobs go back to the queue, running ones are retried or lost).
        """
        w = self.registry.find(ref)
        if w.live and w.running and not force:
            raise Conflict(
                f"worker {w.name} is running {len(w.running)} job(s): {', '.join(w.running)}",
                hint="drain it and wait for them, or remove it with --force (placed jobs go "
                "back to the queue; running ones are retried if they may, else lost)",
                details={"worker": w.id, "jobs": w.running},
                code="worker_busy",
            )
        if w.live:
            await self._lose_worker(w.id, "removed by an admin", WorkerState.OFFLINE)
        await self.registry.remove(w.id)
        self.scheduling.kick()
        return w

    async def deregister(self, worker_id: str) -> None:
        """A clean worker exit: its unfinished jobs are lost (or requeued if they may retry)."""
        if self.registry.get(worker_id) is not None:
            await self._lose_worker(worker_id, "its worker shut down", WorkerState.OFFLINE)

    def return_work(self, worker_id: str, work: Work) -> None:
        """Put undelivered work back (its long-poll's client left before the answer went out)."""
        if self.registry.get(worker_id) is not None:
            self.dispatch.return_work(
                worker_id, work, lambda j: self.jobs.active_job(j) is not None
            )
