"""The dispatcher: what each worker is to start or stop next, and gangs' rendezvous records.

Assignments and cancels wait in per-worker inboxes until the worker's long-poll (``next_work``)
takes them; the poll answers the moment something lands. Inboxes live in memory only: after a
restart the control plane hands placed-but-unstarted jobs out again (``assign``).

An assignment names one attempt of its job. What waits in an inbox may go stale before it is
taken (the worker's own retried reports won the race after a restart, the job was cancelled,
lost or retried), so it is checked against the job as it is *at delivery*: it goes out only while
that attempt is current, still placed on that worker, and the worker has not reported it started;
otherwise it is dropped. A finished attempt is never handed out again. Stale attempts a worker
still holds (it reported on one) go to its ``stop`` list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import (
    AttemptRef,
    CellAssignment,
    Job,
    JobAssignment,
    JobState,
    Rendezvous,
    Work,
)
from ..errors import Conflict
from .signals import Signals

# Jobs whose holders are remembered after they move on (a worker's late report on a stale attempt
# is then told "stale", not "not yours"); in memory only, oldest forgotten first.
HOLDERS_KEPT = 10_000


class Dispatcher:
    """Owns worker inboxes, pending cancels and rendezvous records, and their long-polls."""

    def __init__(
        self, clock: Clock = SYSTEM_CLOCK, job: Callable[[str], Job | None] | None = None
    ) -> None:
        """``job(id)`` is the active job as it is now (None once final): delivery checks each
        assignment against it (without it, as on its own in tests, everything goes out)."""
        self.clock = clock
        self._job = job
        self._inbox: dict[str, list[JobAssignment]] = {}
        self._cancels: dict[str, set[str]] = {}
        self._stops: dict[str, set[tuple[str, int]]] = {}  # worker -> stale (job, attempt)
        # job -> attempt -> workers that reported that attempt started. Per attempt: a job's
        # changes reach ``job_changed`` after the awaits of their write, so a retry's "queued"
        # may arrive after its next attempt was placed; a mark of the old attempt must never
        # keep the new one from its worker (issue 32: a retried job stuck placed).
        self._started: dict[str, dict[int, set[str]]] = {}
        self._holders: OrderedDict[str, set[str]] = OrderedDict()  # job -> workers ever given it
        self._rendezvous: dict[str, Rendezvous] = {}
        # Sessions (ADR 0019): cells to run, and interrupts and restarts, per worker.
        self._cells: dict[str, list[CellAssignment]] = {}
        self._interrupts: dict[str, set[str]] = {}
        self._restarts: dict[str, set[str]] = {}
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
        holders = self._holders.setdefault(job.id, set())
        self._holders.move_to_end(job.id)
        while len(self._holders) > HOLDERS_KEPT:
            self._holders.popitem(last=False)
        for node in job.placement.nodes:
            self._inbox.setdefault(node.worker_id, []).append(
                JobAssignment(
                    job=job, node=node, nnodes=nnodes, secrets=dict(secrets), attempt=job.attempts
                )
            )
            holders.add(node.worker_id)
            if wake:
                self._workers.fire(node.worker_id)
        return [n.worker_id for n in job.placement.nodes]

    def was_given(self, job_id: str, worker_id: str) -> bool:
        """Whether ``worker_id`` was handed some attempt of the job (since this process started)."""
        return worker_id in self._holders.get(job_id, ())

    def started(self, job_id: str, worker_id: str, attempt: int) -> None:
        """The worker reported its part of ``attempt`` of the job started: never hand it that
        attempt again (a redelivered copy would run it twice)."""
        self._started.setdefault(job_id, {}).setdefault(attempt, set()).add(worker_id)

    def deliverable(self, a: JobAssignment, worker_id: str) -> bool:
        """Whether an assignment may still go out: its attempt is current, placed on this
        worker, and not yet started there."""
        if self._job is None:
            return True
        job = self._job(a.job.id)
        return (
            job is not None
            and job.attempts == a.attempt
            and job.state in (JobState.PLACED, JobState.RUNNING)
            and job.placement is not None
            and worker_id in job.placement.worker_ids
            and worker_id not in self._started.get(job.id, {}).get(a.attempt, ())
        )

    def stop_attempt(self, worker_id: str, job_id: str, attempt: int) -> None:
        """Tell ``worker_id`` to stop and drop a stale attempt of a job (not the job itself)."""
        self._stops.setdefault(worker_id, set()).add((job_id, attempt))
        self._workers.fire(worker_id)

    async def redeliver(
        self,
        jobs: Iterable[Job],
        secrets: Callable[[Job], Awaitable[dict[str, str]]],
    ) -> None:
        """After a restart, hand placed-but-not-started ``jobs`` to their workers again.

        Inboxes live in memory, so a restart between placement and delivery would leave the job
        placed forever; a worker that already runs it ignores the duplicate.
        """
        for job in jobs:
            self.assign(job, await secrets(job), wake=False)

    def stop(self, job: Job, but: str | None = None) -> None:
        """Tell every worker holding a part of ``job`` (except ``but``) to stop it, now."""
        assert job.placement is not None
        for worker_id in job.placement.worker_ids:
            if worker_id != but:
                self._cancels.setdefault(worker_id, set()).add(job.id)
                self._workers.fire(worker_id)

    def cell(self, worker_id: str, cell: CellAssignment) -> None:
        """Hand a session's cell to one of its workers (it runs it on its ranks)."""
        self._cells.setdefault(worker_id, []).append(cell)
        self._workers.fire(worker_id)

    def interrupt(self, worker_id: str, session_id: str) -> None:
        self._interrupts.setdefault(worker_id, set()).add(session_id)
        self._workers.fire(worker_id)

    def restart(self, worker_id: str, session_id: str) -> None:
        """Restart a session's ranks on one worker; a multi-node session meets anew."""
        self._rendezvous.pop(session_id, None)
        self._restarts.setdefault(worker_id, set()).add(session_id)
        self._workers.fire(worker_id)

    def forget_worker(self, worker_id: str) -> None:
        """The worker is gone: drop what waited for it and end its long-poll."""
        self._inbox.pop(worker_id, None)
        self._cancels.pop(worker_id, None)
        self._stops.pop(worker_id, None)
        self._cells.pop(worker_id, None)
        self._interrupts.pop(worker_id, None)
        self._restarts.pop(worker_id, None)
        self._workers.fire(worker_id)

    def return_work(
        self, worker_id: str, work: Work, active: Callable[[str], bool] | None = None
    ) -> None:
        """Put undelivered work back, ahead of anything newer (jobs still ``active`` only; each
        is checked again at delivery)."""
        inbox = self._inbox.setdefault(worker_id, [])
        inbox[:0] = [a for a in work.assignments if active is None or active(a.job.id)]
        if work.cancel:
            self._cancels.setdefault(worker_id, set()).update(work.cancel)
        if work.stop:
            self._stops.setdefault(worker_id, set()).update(
                (s.job_id, s.attempt) for s in work.stop
            )
        if work.cells:
            cells = self._cells.setdefault(worker_id, [])
            cells[:0] = [c for c in work.cells if active is None or active(c.session_id)]
        if work.interrupts:
            self._interrupts.setdefault(worker_id, set()).update(work.interrupts)
        if work.restarts:
            self._restarts.setdefault(worker_id, set()).update(work.restarts)
        self._workers.fire(worker_id)

    async def next_work(self, worker_id: str, wait: float, touch: Callable[[], object]) -> Work:
        """Long-poll for new assignments and cancellations; ``touch()`` each round (heartbeat).

        Only assignments still ``deliverable`` go out; the rest are dropped here.
        """
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            touch()
            inbox = [a for a in self._inbox.pop(worker_id, []) if self.deliverable(a, worker_id)]
            cancels = self._cancels.pop(worker_id, set())
            stops = self._stops.pop(worker_id, set())
            cells = self._cells.pop(worker_id, [])
            interrupts = self._interrupts.pop(worker_id, set())
            restarts = self._restarts.pop(worker_id, set())
            left = deadline - self.clock.monotonic()
            news = inbox or cancels or stops or cells or interrupts or restarts
            if news or left <= 0 or not self.open:
                return Work(
                    assignments=inbox,
                    cancel=sorted(cancels),
                    stop=[AttemptRef(job_id=j, attempt=n) for j, n in sorted(stops)],
                    cells=cells,
                    interrupts=sorted(interrupts),
                    restarts=sorted(restarts),
                )
            await self._workers.wait(worker_id, left)

    # -- rendezvous ------------------------------------------------------------------------------

    def publish(self, job_id: str, rdzv: Rendezvous) -> None:
        self._rendezvous[job_id] = rdzv
        self._jobs.fire(job_id)

    def has_rendezvous(self, job_id: str) -> bool:
        return job_id in self._rendezvous

    def job_changed(self, job: Job) -> None:
        """A job moved or changed: a requeued or final job's record goes; its waiters re-check."""
        if job.state.terminal:
            self._started.pop(job.id, None)
        elif job.placement is None and job.id in self._started:
            # A new attempt starts from nothing; the marks of a later one (this change arrived
            # after it was placed) stay.
            marks = {n: w for n, w in self._started[job.id].items() if n >= job.attempts}
            if marks:
                self._started[job.id] = marks
            else:
                del self._started[job.id]
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
