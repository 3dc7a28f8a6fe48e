"""Workers' reports in protocol 1.1: everything about an attempt in one entry, many in a batch.

A :class:`~gpulayer_kernel.contracts.JobReport` says what one attempt did since the last report:
it started, printed lines, moved its progress, ended. They are applied in that order through the
same rules as the one-call-per-kind reports (``held`` checks the worker and the attempt; lines go
through the log tails; the end through ``Outcomes``), so the two protocols cannot disagree. What
changes is what is written: a short job's start and end arrive together, and the start is
folded into the end (``JobTable.fold``): its row is written once for both, with the ledger's
estimate kept and its charge made once, in the same commit.

Entries of a batch are independent: each is answered on its own (a refusal, or None), so a stale
or invalid entry refuses that entry only. They are applied concurrently, and what they change in
jobs is flushed once for the whole batch (``JobTable.grouped``): one group commit, one event per
change, waiters woken after it, before the batch is answered. A flush per end was 3.0 of 7.9 s
of the server's profile under the throughput benchmark; one a batch cut its CPU per job ~13%.
A flush that fails refuses every entry whose job it carried, with the store's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Job, JobReport, JobState, ensure_json
from ..errors import GPUlayerError
from .dispatch import Dispatcher
from .jobs import Change, JobTable
from .logs import LogTails
from .outcomes import Outcomes


class Reports:
    """Applies batches of workers' reports (no state of its own)."""

    def __init__(
        self,
        jobs: JobTable,
        tails: LogTails,
        dispatch: Dispatcher,
        outcomes: Outcomes,
        *,
        made_by: Callable[[Job], Awaitable[None]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``made_by``: records that a finished job's artifacts are its owner's (``Blobs``)."""
        self.jobs = jobs
        self.tails = tails
        self.dispatch = dispatch
        self.outcomes = outcomes
        self.made_by = made_by
        self.clock = clock

    async def apply(
        self, worker_id: str, reports: Sequence[JobReport]
    ) -> list[GPUlayerError | None]:
        """Apply each entry; its refusal (None: taken), in the batch's order."""
        tasks = [asyncio.ensure_future(self._one(worker_id, r)) for r in reports]
        held: list[Change] = []
        try:
            await self.jobs.grouped(tasks, held)
        except GPUlayerError as exc:
            if not all(t.done() for t in tasks):  # pragma: no cover - cancelled meanwhile
                raise
            # Kept dirty, written once the store answers: no entry that changed a job in it
            # is taken before then (the worker sends it again; a repeated end is idempotent).
            ids = {c.after.id for c in held}
            return [
                exc if a is None and r.job_id in ids else a
                for a, r in zip((t.result() for t in tasks), reports, strict=True)
            ]
        return [t.result() for t in tasks]  # an unexpected error is raised, as gather did

    async def _one(self, worker_id: str, r: JobReport) -> GPUlayerError | None:
        try:
            await self._apply(worker_id, r)
        except GPUlayerError as exc:
            return exc
        return None

    async def _apply(self, worker_id: str, r: JobReport) -> None:
        held = self.outcomes.held
        job = held(worker_id, r.job_id, r.attempt)
        if r.started:
            self.dispatch.started(job.id, worker_id, job.attempts)  # never again to it
        if r.finished is None and r.started and job.state == JobState.PLACED:
            # Still running after the worker's linger: a start that matters on its own.
            await self.jobs.commit(job.id, JobState.RUNNING, started_at=self.clock.now())
        if r.progress is not None:
            ensure_json(r.progress, "progress")
        if r.finished is None:
            if r.lines:
                held(worker_id, r.job_id, r.attempt)  # an await may have moved the job on
                await self.tails.append(job.id, r.lines)
            if r.progress is not None:
                held(worker_id, r.job_id, r.attempt)
                await self.jobs.note(job.id, progress=dict(r.progress))
            return
        if r.progress is not None:
            self.jobs.stage(job.id, progress=dict(r.progress))  # written with the end
        if not r.lines:
            await self.finish(worker_id, r)
            return
        # The lines are queued in the store before the end (the store commits in order: they
        # are durable no later than the end), and the end does not wait for them to be.
        appending = asyncio.ensure_future(self.tails.append(job.id, r.lines))
        if self.tails.numbered(job.id):
            await asyncio.sleep(0)  # one loop turn: the append queues its rows (no await first)
        else:
            await appending  # its numbering is read from the store first: keep the order
        try:
            await self.finish(worker_id, r)
        finally:
            await appending

    async def finish(self, worker_id: str, r: JobReport) -> Job:
        """An entry's end, idempotent as ``ControlPlane.report_finished`` (a repeat of an end
        already recorded is taken, and changes nothing)."""
        assert r.finished is not None
        report = r.finished.model_copy(update={"attempt": r.attempt})
        if self.jobs.active_job(r.job_id) is None:
            stored = self.jobs.cached(r.job_id) or await self.jobs.store.get_job(r.job_id)
            again = stored is not None and r.attempt in (None, stored.attempts)
            if stored is not None and again and stored.state.terminal:
                if r.job_id in self.jobs.dirty:
                    await self.jobs.resync()  # acknowledged only once it is stored
                return stored
        job = self.outcomes.held(worker_id, r.job_id, r.attempt)
        done = await self.outcomes.finished(worker_id, job, report, started=r.started)
        await self.made_by(done)
        return done
