"""Job outcomes: what a finish report, a cancel, a lost worker or a missed rendezvous does to a job.

Each rule here is written once: a failed job that asked for retries is queued again as a new
attempt (never a gang: one failed rank usually means all fail again); a gang fails fast, stopping
every other rank and naming the one that failed; a cancel that reaches a placed job waits for its
workers to confirm. Every change goes through the job table's commit path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import FinishReport, Job, JobState, WorkerState
from .dispatch import Dispatcher
from .jobs import JobTable
from .logs import LogTails
from .workers import WorkerRegistry


class Outcomes:
    """Decides and records how jobs end or go round again; owns no state of its own."""

    def __init__(
        self,
        jobs: JobTable,
        workers: WorkerRegistry,
        logs: LogTails,
        dispatch: Dispatcher,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rendezvous_timeout: float = 120.0,
    ) -> None:
        self.jobs = jobs
        self.workers = workers
        self.logs = logs
        self.dispatch = dispatch
        self.clock = clock
        self.rendezvous_timeout = rendezvous_timeout

    @staticmethod
    def may_retry(job: Job) -> bool:
        # A gang job is never retried automatically: one failed rank usually means all fail again.
        return not job.spec.is_gang and job.attempts < job.spec.retries

    async def retry(self, job: Job, why: str) -> Job:
        """Queue the job again as its next attempt, saying why in its log."""
        attempt = job.attempts + 1
        await self.logs.system(
            job.id, f"attempt {attempt} failed ({why}); retrying ({attempt}/{job.spec.retries})"
        )
        return await self.jobs.commit(
            job.id,
            JobState.QUEUED,
            attempts=attempt,
            placement=None,
            cancel_requested=False,
            exit_code=None,
            started_at=None,
            placed_at=None,
            progress=None,
        )

    async def retry_or_lose(self, job: Job, reason: str) -> Job:
        if self.may_retry(job):
            return await self.retry(job, reason)
        await self.logs.system(job.id, reason)
        return await self.jobs.commit(job.id, JobState.LOST, reason=reason)

    async def cancel(self, job: Job, reason: str) -> Job:
        """A queued job is cancelled now; a placed or running one once its workers stop it."""
        if job.state.terminal:
            return job
        if job.state == JobState.QUEUED:
            job = await self.jobs.commit(job.id, JobState.CANCELLED, reason=reason)
            await self.logs.system(job.id, reason)
            return job
        job = await self.jobs.commit(job.id, cancel_requested=True, reason=reason)
        self.dispatch.stop(job)
        await self.logs.system(job.id, f"{reason}; stopping its processes")
        return job

    async def finished(self, worker_id: str, job: Job, report: FinishReport) -> Job:
        """A worker's report that its part of ``job`` ended."""
        assert job.placement is not None
        if len(job.placement.nodes) > 1:
            return await self._node_finished(worker_id, job, report)
        return await self._finish(job, report)

    async def _finish(self, job: Job, report: FinishReport) -> Job:
        state = JobState(report.state)
        if job.cancel_requested and state != JobState.SUCCEEDED:
            state = JobState.CANCELLED
        if state == JobState.FAILED and self.may_retry(job):
            return await self.retry(job, report.reason or f"exit code {report.exit_code}")
        return await self.jobs.commit(
            job.id,
            state,
            exit_code=report.exit_code,
            reason=job.reason if state == JobState.CANCELLED else report.reason,
            result=report.result,
            artifacts=[*job.artifacts, *report.artifacts],
            finished_at=self.clock.now(),
        )

    async def _node_finished(self, worker_id: str, job: Job, report: FinishReport) -> Job:
        """A multi-node gang: the first failing node fails the job and stops the others."""
        assert job.placement is not None
        node = next(n for n in job.placement.nodes if n.worker_id == worker_id)
        if report.state != "succeeded":
            self.dispatch.stop(job, but=worker_id)
            reason = f"node {node.node_rank} ({node.worker_name}): {report.reason or 'failed'}"
            return await self._finish(job, report.model_copy(update={"reason": reason}))
        nodes = len(job.placement.nodes)
        fields: dict[str, Any] = {"artifacts": [*job.artifacts, *report.artifacts]}
        if node.node_rank == 0:
            fields["result"] = report.result  # rank 0's result is the job's
        job = await self.jobs.commit(job.id, **fields)
        if self.jobs.node_done(job.id, worker_id) < nodes:
            return job
        return await self._finish(
            job, report.model_copy(update={"artifacts": [], "result": job.result})
        )

    async def lose_worker(self, worker_id: str, why: str, state: WorkerState) -> None:
        """A worker stopped answering (lost) or left (offline): so do the jobs it held."""
        w = self.workers.mark_gone(worker_id, state)
        self.dispatch.forget_worker(worker_id)
        for listed in self.jobs.active():
            job = self.jobs.active_job(listed.id)  # an earlier await may have ended it
            if job is None or job.placement is None or worker_id not in job.placement.worker_ids:
                continue
            if job.state not in (JobState.PLACED, JobState.RUNNING):
                continue
            self.dispatch.stop(job, but=worker_id)  # the rest of a multi-node gang
            if job.cancel_requested:
                await self.jobs.commit(job.id, JobState.CANCELLED, reason=job.reason)
            else:
                await self.retry_or_lose(job, f"worker {w.name} was lost: {why}")
        await self.workers.save(worker_id)

    async def orphans_at_start(self) -> None:
        """Placed or running jobs whose worker did not come back: the reaper never sees them."""
        for job in self.jobs.active():
            if job.placement is None or job.state == JobState.QUEUED:
                continue
            if all(self._live(wid) for wid in job.placement.worker_ids):
                continue
            reason = "its worker was gone when the control plane restarted"
            await self.logs.system(job.id, reason)
            if self.may_retry(job):
                await self.retry(job, reason)
            else:
                await self.jobs.commit(job.id, JobState.LOST, reason=reason)

    async def redeliver_placed(
        self, secrets: Callable[[Sequence[str]], Awaitable[dict[str, str]]]
    ) -> None:
        """After a restart, hand placed-but-not-started jobs whose workers are known out again."""
        placed = [
            j
            for j in self.jobs.active()
            if j.state == JobState.PLACED
            and j.placement is not None
            and all(self.workers.get(wid) for wid in j.placement.worker_ids)
        ]
        await self.dispatch.redeliver(placed, secrets)

    def _live(self, worker_id: str) -> bool:
        w = self.workers.get(worker_id)
        return w is not None and w.live

    async def rendezvous_overdue(self) -> None:
        """Fail gangs whose rank 0 never published its address within ``rendezvous_timeout``."""
        now = self.clock.now()
        for listed in self.jobs.active():
            job = self.jobs.active_job(listed.id)
            if (
                job is not None
                and job.placement is not None
                and len(job.placement.nodes) > 1
                and not self.dispatch.has_rendezvous(job.id)
                and job.placed_at is not None
                and now - job.placed_at > self.rendezvous_timeout
                and not job.cancel_requested
            ):
                reason = (
                    f"rendezvous did not complete within {self.rendezvous_timeout:g}s: the "
                    "rank-0 worker never published its address"
                )
                # Fail (not cancel) the gang at once, as a failed node does: a cancel would
                # leave the job placed until every worker reported, and call it "cancelled".
                self.dispatch.stop(job)
                await self.logs.system(job.id, reason)
                await self.jobs.commit(job.id, JobState.FAILED, reason=reason)
