"""The dispatcher: what each worker is to start or stop next, and gangs' rendezvous records.

Assignments and cancels wait in per-worker inboxes until the worker's long-poll (``next_work``)
takes them; the poll answers the moment something lands. Inboxes live in memory only: after a
restart the control plane hands placed-but-unstarted jobs out again (``assign``), and a worker
that already runs one ignores the duplicate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Job, JobAssignment, Rendezvous, Work
from ..errors import Conflict
from .signals import Signals


class Dispatcher:
    """Owns worker inboxes, pending cancels and rendezvous records, and their long-polls."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._inbox: dict[str, list[JobAssignment]] = {}
        self._cancels: dict[str, set[str]] = {}
        self._rendezvous: dict[str, Rendezvous] = {}
        self._workers = Signals(clock)  # by worker id: new work or cancels
        self._jobs = Signals(clock)  # by job id: a rendezvous or a change of the job
        # Until the control plane starts (and after it stops) a long-poll answers at once.
        self.open = False

    def close(self) -> None:
        self.open = False
        self._workers.fire_all()
        self._jobs.fire_all()

    # -- work ------------------------------------------------------------------------------------

    def assign(self, job: Job, secrets: Mapping[str, str], *, wake: bool = True) -> list[str]:
        """Queue each node of a placed job for its worker; returns those workers' ids."""
        assert job.placement is not None
        nnodes = len(job.placement.nodes)
        for node in job.placement.nodes:
            self._inbox.setdefault(node.worker_id, []).append(
                JobAssignment(job=job, node=node, nnodes=nnodes, secrets=dict(secrets))
            )
            if wake:
                self._workers.fire(node.worker_id)
        return [n.worker_id for n in job.placement.nodes]

    async def redeliver(
        self,
        jobs: Iterable[Job],
        secrets: Callable[[Sequence[str]], Awaitable[dict[str, str]]],
    ) -> None:
        """After a restart, hand placed-but-not-started ``jobs`` to their workers again.

        Inboxes live in memory, so a restart between placement and delivery would leave the job
        placed forever; a worker that already runs it ignores the duplicate.
        """
        for job in jobs:
            self.assign(job, await secrets(job.spec.secrets), wake=False)

    def stop(self, job: Job, but: str | None = None) -> None:
        """Tell every worker holding a part of ``job`` (except ``but``) to stop it, now."""
        assert job.placement is not None
        for worker_id in job.placement.worker_ids:
            if worker_id != but:
                self._cancels.setdefault(worker_id, set()).add(job.id)
                self._workers.fire(worker_id)

    def forget_worker(self, worker_id: str) -> None:
        """The worker is gone: drop what waited for it and end its long-poll."""
        self._inbox.pop(worker_id, None)
        self._cancels.pop(worker_id, None)
        self._workers.fire(worker_id)

    def return_work(self, worker_id: str, work: Work, active: Callable[[str], bool]) -> None:
        """Put undelivered work back, ahead of anything newer (jobs still ``active`` only)."""
        inbox = self._inbox.setdefault(worker_id, [])
        inbox[:0] = [a for a in work.assignments if active(a.job.id)]
        if work.cancel:
            self._cancels.setdefault(worker_id, set()).update(work.cancel)
        self._workers.fire(worker_id)

    async def next_work(self, worker_id: str, wait: float, touch: Callable[[], object]) -> Work:
        """Long-poll for new assignments and cancellations; ``touch()`` each round (heartbeat)."""
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            touch()
            inbox = self._inbox.pop(worker_id, [])
            cancels = self._cancels.pop(worker_id, set())
            left = deadline - self.clock.monotonic()
            if inbox or cancels or left <= 0 or not self.open:
                return Work(assignments=inbox, cancel=sorted(cancels))
            await self._workers.wait(worker_id, left)

    # -- rendezvous ------------------------------------------------------------------------------

    def publish(self, job_id: str, rdzv: Rendezvous) -> None:
        self._rendezvous[job_id] = rdzv
        self._jobs.fire(job_id)

    def has_rendezvous(self, job_id: str) -> bool:
        return job_id in self._rendezvous

    def job_changed(self, job: Job) -> None:
        """A job moved or changed: a requeued or final job's record goes; its waiters re-check."""
        if job.state.terminal or job.placement is None:
            self._rendezvous.pop(job.id, None)
        if job.state.terminal:
            self._jobs.drop(job.id)
        else:
            self._jobs.fire(job.id)

    async def rendezvous(self, job_id: str, wait: float, owned: Callable[[], Job]) -> Rendezvous:
        """Long-poll for the rank-0 worker's record; ``owned()`` re-checks the caller each round."""
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            job = owned()
            if job_id in self._rendezvous:
                return self._rendezvous[job_id]
            left = deadline - self.clock.monotonic()
            if left <= 0 or job.state.terminal or job.cancel_requested:
                raise Conflict(
                    f"no rendezvous for job {job_id} yet",
                    hint="the rank-0 worker has not published its address",
                    code="rendezvous_pending",
                )
            await self._jobs.wait(job_id, left)
