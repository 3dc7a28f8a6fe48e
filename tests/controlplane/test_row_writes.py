"""How often a job's row is written (issue 14): once per state change that matters.

A short job (it ends within the worker's report linger) is written three times: queued at
submit, placed (what a restarted control plane redelivers from), and its end with its start
folded in. A longer one is written once more, when it is known to run. Counted at the store, a
real SQLite store that counts the job rows it is given (a fake over the real thing, no mock).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    Job,
    JobSpec,
    JobState,
    WorkerCapabilities,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport


class CountingStore(SqliteStore):
    """SQLite, remembering the state of every job row it writes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.rows: list[tuple[str, JobState]] = []

    def _job_rows(self, jobs: Sequence[Job]) -> list[tuple[Any, ...]]:
        self.rows += [(j.id, j.state) for j in jobs]
        return super()._job_rows(jobs)

    def written(self, job_id: str) -> list[JobState]:
        return [state for jid, state in self.rows if jid == job_id]


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, CountingStore]]:
    store = CountingStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"))
    await cp.start()
    agent = WorkerAgent(
        InProcessTransport(cp),
        WorkerRegistration(name="w", capabilities=WorkerCapabilities()),
        # a generous linger: a loaded machine must not turn the short job into a long one
        ExecutorConfig(work_root=tmp_path / "work", report_linger=2.0),
    )
    await agent.start()
    try:
        yield cp, store
    finally:
        await agent.stop()
        await cp.close()
        await store.close()


async def _run(cp: ControlPlane, argv: list[str]) -> Job:
    job = await cp.submit(JobSpec(workload=CommandWorkload(argv=argv)))
    done = await cp.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED, done  # (a job's waiters wake once it is written)
    return done


async def test_a_short_job_is_written_three_times_its_start_with_its_end(
    counted: tuple[ControlPlane, CountingStore],
) -> None:
    cp, store = counted
    job = await _run(cp, ["true"])
    assert store.written(job.id) == [JobState.QUEUED, JobState.PLACED, JobState.SUCCEEDED]
    assert any(a.started_at is not None for a in job.history)  # the start was kept, not lost


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
async def test_a_job_that_outlives_the_linger_is_written_once_more_when_it_runs(
    counted: tuple[ControlPlane, CountingStore],
) -> None:
    cp, store = counted
    job = await _run(cp, [sys.executable, "-c", "import time; time.sleep(2.5)"])
    assert store.written(job.id) == [
        JobState.QUEUED,
        JobState.PLACED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ]
