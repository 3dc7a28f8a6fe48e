"""A retried job is never stuck ``placed`` (issue 32, item 11).

``test_retries_are_opt_in_and_counted`` once found a ``false`` job with ``retries=2`` still
``placed`` at attempt 1 after 30 s. The race: a retry stages the job ``queued`` (attempt 1) in
memory, then awaits its log line and its write before it announces the change. A scheduling
pass in between places attempt 1 on the same worker, and the dispatcher, not told yet that
attempt 0 was over, still held that worker's "started" mark for the job: attempt 1's assignment
was dropped at delivery, and nothing would ever hand it out again. The dispatcher now keeps the
mark per attempt.

Below: the mechanism, exactly; then a hunt: many retried jobs on real workers, with the control
plane's writes delayed at random moments, every one must end ``failed`` after all its attempts.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from gpulayer_kernel.contracts import (
    CommandWorkload,
    Job,
    JobSpec,
    JobState,
    NodePlacement,
    Placement,
    WorkerCapabilities,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.controlplane.dispatch import Dispatcher
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport

SPEC = JobSpec(workload=CommandWorkload(argv=["false"]), retries=2, retry_on=["failed"])


def job(state: JobState, attempt: int, on: str | None = "w1") -> Job:
    placement = (
        Placement(nodes=[NodePlacement(worker_id=on, worker_name=on, node_rank=0)]) if on else None
    )
    return Job(
        id="j" * 12,
        seq=1,
        spec=SPEC,
        submitted_at=0,
        state=state,
        attempts=attempt,
        placement=placement,
    )


async def test_a_mark_of_the_old_attempt_never_holds_back_the_new_one() -> None:
    current: dict[str, Job] = {}
    d = Dispatcher(FakeClock(), job=current.get)
    d.open = True
    first = job(JobState.RUNNING, 0)
    current[first.id] = first
    d.started(first.id, "w1", 0)  # attempt 0 ran on w1
    # The retry's "queued" is staged but not announced yet; attempt 1 is placed on w1 meanwhile.
    second = job(JobState.PLACED, 1)
    current[second.id] = second
    d.job_changed(second)
    d.assign(second, {})
    work = await d.next_work("w1", 0, lambda: None)
    assert [(a.job.id, a.attempt) for a in work.assignments] == [(second.id, 1)]
    # The late "queued" of the retry keeps attempt 1's own mark.
    d.started(second.id, "w1", 1)
    d.job_changed(job(JobState.QUEUED, 1, on=None))
    d.assign(second, {})  # a redelivery of attempt 1 to the worker that started it: dropped
    assert (await d.next_work("w1", 0, lambda: None)).assignments == []


class DelayedStore(SqliteStore):
    """A real SQLite store whose job writes sometimes take a while (a loaded disk): the retry's
    awaits between staging and announcing get longer, at random moments."""

    rng = random.Random()

    async def save_jobs(self, jobs: list[Job]) -> None:  # type: ignore[override]
        if self.rng.random() < 0.5:
            await asyncio.sleep(self.rng.uniform(0.0, 0.03))
        await super().save_jobs(jobs)

    async def save_jobs_and_costs(self, jobs: list[Job], rows: list[object]) -> None:  # type: ignore[override]
        if self.rng.random() < 0.5:
            await asyncio.sleep(self.rng.uniform(0.0, 0.03))
        await super().save_jobs_and_costs(jobs, rows)  # type: ignore[arg-type]


async def test_many_retried_jobs_all_end_after_their_attempts(tmp_path: Path) -> None:
    store = DelayedStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"), heartbeat_timeout=30.0)
    await cp.start()
    agents = [
        WorkerAgent(
            InProcessTransport(cp),
            WorkerRegistration(name=f"w{i}", capabilities=WorkerCapabilities()),
            ExecutorConfig(work_root=tmp_path / f"work-{i}"),
            heartbeat_interval=0.5,
        )
        for i in range(2)
    ]
    try:
        for a in agents:
            await a.start()
        spec = SPEC.model_copy(update={"retry_backoff": 0})
        jobs = [await cp.submit(spec) for _ in range(30)]
        done = await asyncio.gather(*(cp.wait(j.id, timeout=45) for j in jobs))
        stuck = [(j.id, j.state.value, j.attempts) for j in done if not j.state.terminal]
        assert not stuck, stuck
        assert all((j.state, j.attempts) == (JobState.FAILED, 2) for j in done), [
            (j.state.value, j.attempts) for j in done
        ]
    finally:
        for a in agents:
            await a.stop()
        await cp.close()
        await store.close()
