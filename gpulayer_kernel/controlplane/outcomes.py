"""Job outcomes: what a finish report, a cancel, a lost worker or a missed rendezvous does to a job.

Each rule here is written once: a job that asked for retries is queued again as a new attempt
when it failed in a way it named (ADR 0011: ``retry_on``, by default a lost worker or a preempted
instance; a failing exit only with ``"failed"`` or a listed ``retry_exit_codes``), after a capped
exponential backoff with jitter (``retry_at``; the scheduling loop holds it until then); never a
gang unless it asked (``retry_gang``): one failed rank usually means all fail again. A gang fails
fast, stopping every other rank and naming the one that failed. How each attempt ended goes to
the ledger with the change (``AttemptEnd``). A cancel ends a job in any state that is not
final: a queued job at once; a placed or running one once its workers confirm the stop, at once
if one of them is gone (lost, offline, unknown), and at the latest ``cancel_timeout`` seconds
after the request if they never answer. Every change goes through the job table's commit path.

Logs of attempts stay apart: a new attempt begins after the control plane's line "attempt N
failed (…); retrying", written once the job has moved on, and from then on the old attempt's
late lines (and every other report of it) are refused as ``stale_attempt``.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import FinishReport, Job, JobState, WorkerState
from ..contracts.jobs import RetryCause
from ..errors import Conflict
from .dispatch import Dispatcher
from .jobs import JobTable
from .logs import LogTails
from .provisioning.ledger import AttemptEnd
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
        cancel_timeout: float = 60.0,
    ) -> None:
        self.jobs = jobs
        self.workers = workers
        self.logs = logs
        self.dispatch = dispatch
        self.clock = clock
        self.rendezvous_timeout = rendezvous_timeout
        # Long enough for a worker to stop a job (SIGTERM, its grace, SIGKILL) and ship its end.
        self.cancel_timeout = cancel_timeout
        self._cancel_asked: dict[str, float] = {}  # job id -> when its stop was asked (monotonic)
        self.rng = random.Random()  # retry jitter; a test may seed it

    def held(self, worker_id: str, job_id: str, attempt: int | None = None) -> Job:
        """The active job a worker reports on, if that worker (known, not lost) holds part of it
        and the report's ``attempt`` (None: an older worker's, taken as current) is current.

        A report from an attempt that is no longer current is refused (409 ``stale_attempt``)
        and the attempt goes on the worker's stop list, so its process stops there too.
        """
        self.workers.require(worker_id)
        job = self.jobs.cached(job_id)
        if attempt is not None and job is not None and attempt != job.attempts:
            self.dispatch.stop_attempt(worker_id, job_id, attempt)
            raise Conflict(
                f"attempt {attempt} of job {job_id} is stale: the job is on attempt "
                f"{job.attempts} ({job.state.value})",
                hint="the worker stops that attempt's process and drops its reports",
                details={"job": job_id, "attempt": attempt, "current": job.attempts},
                code="stale_attempt",
            )
        return self.jobs.held_by(job_id, worker_id)

    @staticmethod
    def may_retry(job: Job, cause: RetryCause = "lost", exit_code: int | None = None) -> bool:
        """Whether this failure of ``job`` retries: it asked for retries left, for this cause
        (or this exit code), and it is no gang unless it asked that too."""
        spec = job.spec
        if spec.is_gang and not spec.retry_gang:
            return False  # one failed rank usually means all fail again
        if job.attempts - job.requeues >= spec.retries:
            return False
        if cause in spec.retry_on:
            return True
        return cause == "failed" and exit_code is not None and exit_code in spec.retry_exit_codes

    def backoff(self, job: Job) -> float:
        """Seconds before the next attempt: ``retry_backoff`` doubled per retry so far, capped
        at ``retry_backoff_max``, of which a random half (equal jitter: retries of many jobs
        that failed together do not come back together, and none comes back at once)."""
        spec = job.spec
        n = job.attempts - job.requeues
        top = min(spec.retry_backoff_max, spec.retry_backoff * 2.0 ** min(n, 30))
        return top / 2 + self.rng.uniform(0, top / 2)

    async def retry(
        self, job: Job, why: str, cause: RetryCause = "failed", exit_code: int | None = None
    ) -> Job:
        """Queue the job again as its next attempt (after its backoff), saying why in its log."""
        attempt = job.attempts + 1
        delay = self.backoff(job)
        retry_at = self.clock.now() + delay if delay > 0 else None
        # Staged (in memory, no await) before the line is written: from here on a late line of
        # the old attempt is refused, so none lands after the line that marks the new attempt.
        change = self.jobs.stage(
            job.id,
            JobState.QUEUED,
            ended=AttemptEnd(cause, why, exit_code, retry_at),
            attempts=attempt,
            placement=None,
            cancel_requested=False,
            exit_code=None,
            started_at=None,
            placed_at=None,
            progress=None,
            retry_at=retry_at,
        )
        wait = f" in {delay:.1f}s" if delay > 0 else ""
        await self.logs.system(
            job.id,
            f"attempt {attempt} failed ({why}); retrying ({attempt}/{job.spec.retries}){wait}",
        )
        await self.jobs.flush([change])
        return change.after

    async def requeue(self, job: Job, why: str) -> Job:
        """Put a placed job that never started back in the queue, as a new attempt that does
        not count against its retries: nothing ran, so placing it again is safe."""
        job = await self.jobs.commit(
            job.id,
            JobState.QUEUED,
            ended=AttemptEnd("requeued", why),
            attempts=job.attempts + 1,
            requeues=job.requeues + 1,
            placement=None,
            cancel_requested=False,
            exit_code=None,
            started_at=None,
            placed_at=None,
            progress=None,
        )
        await self.logs.system(job.id, f"{why}; it never started, so it is back in the queue")
        return job

    async def retry_or_lose(self, job: Job, reason: str, cause: RetryCause = "lost") -> Job:
        if self.may_retry(job, cause):
            return await self.retry(job, reason, cause)
        # Staged before the line is written (no await between): a gang's other rank, told to
        # stop, may report "cancelled" meanwhile; it must find the job lost already.
        change = self.jobs.stage(
            job.id, JobState.LOST, ended=AttemptEnd(cause, reason), reason=reason
        )
        await self.logs.system(job.id, reason)
        await self.jobs.flush([change])
        return change.after

    async def cancel(self, job: Job, reason: str) -> Job:
        """A queued job is cancelled now; a placed or running one once its workers stop it (now
        if one of them is gone; at the latest ``cancel_timeout`` seconds from now)."""
        if job.state.terminal:
            return job
        if job.state == JobState.QUEUED:
            job = await self.jobs.commit(job.id, JobState.CANCELLED, reason=reason)
            await self.logs.system(job.id, reason)
            return job
        assert job.placement is not None
        if not all(self._live(wid) for wid in job.placement.worker_ids):
            # Nobody is left to confirm the stop: end it here; any live rank is told to stop.
            self.dispatch.stop(job)
            job = await self.jobs.commit(job.id, JobState.CANCELLED, reason=reason)
            await self.logs.system(job.id, f"{reason}; its worker is gone")
            return job
        job = await self.jobs.commit(job.id, cancel_requested=True, reason=reason)
        self.dispatch.stop(job)
        self._cancel_asked.setdefault(job.id, self.clock.monotonic())
        await self.logs.system(job.id, f"{reason}; stopping its processes")
        return job

    async def cancels_overdue(self) -> None:
        """End cancelled jobs whose workers did not confirm the stop within ``cancel_timeout``."""
        now = self.clock.monotonic()
        for job_id, asked in list(self._cancel_asked.items()):
            job = self.jobs.active_job(job_id)
            if job is None or not job.cancel_requested:
                del self._cancel_asked[job_id]
            elif now - asked >= self.cancel_timeout:
                del self._cancel_asked[job_id]
                why = f"its worker did not confirm the stop within {self.cancel_timeout:g}s"
                await self.logs.system(job_id, f"cancelled: {why}")
                await self.jobs.commit(job_id, JobState.CANCELLED, reason=job.reason)

    async def overdue(self) -> None:
        """The reaper's round: gangs without a rendezvous, cancels without a confirmation."""
        await self.rendezvous_overdue()
        await self.cancels_overdue()

    async def finished(
        self, worker_id: str, job: Job, report: FinishReport, *, started: bool = False
    ) -> Job:
        """A worker's report that its part of ``job`` ended.

        A job still placed here ran without its start being recorded: its worker folded the
        start into this report (``started``: a short job, protocol 1.1), or the start never
        arrived but the job succeeded. The start is staged now and written with the end, in
        the same write of the job.
        """
        assert job.placement is not None
        if job.state == JobState.PLACED and (started or report.state == "succeeded"):
            self.dispatch.started(job.id, worker_id, job.attempts)
            self.jobs.fold(self.jobs.stage(job.id, JobState.RUNNING, started_at=self.clock.now()))
            job = self.jobs.active_job(job.id) or job
        assert job.placement is not None
        try:
            if len(job.placement.nodes) > 1:
                return await self._node_finished(worker_id, job, report)
            return await self._finish(job, report)
        finally:
            kept = self.jobs.unfold(job.id)  # a path that wrote nothing: the start on its own
            if kept:
                await self.jobs.flush(kept)

    async def _finish(self, job: Job, report: FinishReport) -> Job:
        state = JobState(report.state)
        if job.cancel_requested and state != JobState.SUCCEEDED:
            state = JobState.CANCELLED
        elif state == JobState.CANCELLED:
            # Nobody asked: its worker stopped it as it shut down (Slurm's scancel, a machine
            # taken back, SIGTERM). The job was lost, not cancelled: it may go round again.
            why = f"its worker stopped it ({report.reason or 'it shut down'})"
            return await self.retry_or_lose(job, why, "lost")
        if state == JobState.FAILED and self.may_retry(job, "failed", report.exit_code):
            why = report.reason or f"exit code {report.exit_code}"
            return await self.retry(job, why, "failed", report.exit_code)
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
            dead = self.workers.dead_peer(job.placement.worker_ids, but=worker_id)
            if dead is not None and not job.cancel_requested:
                # A peer's worker died first (this node's ranks only lost it): the gang is
                # lost, as when the control plane notices the death before this report.
                return await self.retry_or_lose(job, f"{dead}; {reason}", "lost")
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

    async def lose_worker(
        self, worker_id: str, why: str, state: WorkerState, *, preempted: bool = False
    ) -> None:
        """A worker stopped answering (lost) or left (offline): so do the jobs it held. On a
        ``preempted`` instance they end ``lost`` with reason ``preempted: ...``."""
        w = self.workers.mark_gone(worker_id, state)
        cause: RetryCause = "preempted" if preempted else "lost"
        lost = (
            f"preempted: worker {w.name} ({why})"
            if preempted
            else f"worker {w.name} was lost: {why}"
        )
        self.dispatch.forget_worker(worker_id)
        for listed in self.jobs.active():
            job = self.jobs.active_job(listed.id)  # an earlier await may have ended it
            if job is None or job.placement is None or worker_id not in job.placement.worker_ids:
                continue
            if job.state not in (JobState.PLACED, JobState.RUNNING):
                continue
            # If it comes back (it was only paused), its first poll tells it to stop this
            # attempt: the job moves on without it, and the process must not run on unseen.
            self.dispatch.stop_attempt(worker_id, job.id, job.attempts)
            self.dispatch.stop(job, but=worker_id)  # the rest of a multi-node gang
            if job.cancel_requested:
                await self.jobs.commit(job.id, JobState.CANCELLED, reason=job.reason)
            elif job.state == JobState.PLACED:
                await self.requeue(job, lost)
            else:
                await self.retry_or_lose(job, lost, cause)
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
            if self.may_retry(job, "lost"):
                await self.retry(job, reason, "lost")
            else:
                await self.jobs.commit(
                    job.id, JobState.LOST, ended=AttemptEnd("lost", reason), reason=reason
                )

    async def redeliver_placed(self, secrets: Callable[[Job], Awaitable[dict[str, str]]]) -> None:
        """After a restart, hand placed-but-not-started jobs whose workers are known out again,
        and send cancels that were pending again (their deadline starts over).

        What is handed out is checked again when a worker takes it: an attempt that ended or
        started in the meantime (its worker's retried reports won the race) is never delivered.
        """
        placed = [
            j
            for j in self.jobs.active()
            if j.state == JobState.PLACED
            and j.placement is not None
            and all(self.workers.get(wid) for wid in j.placement.worker_ids)
        ]
        await self.dispatch.redeliver(placed, secrets)
        for job in self.jobs.active():
            if job.cancel_requested and job.placement is not None:
                self.dispatch.stop(job)
                self._cancel_asked[job.id] = self.clock.monotonic()

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
