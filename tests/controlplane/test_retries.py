"""Retries as ADR 0011 says, on a FakeClock: opt-in, only the failures asked for (lost and
preempted by default, exit codes on request), capped exponential backoff with jitter between
attempts, gangs only when asked, and every attempt's history kept on the job."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    FinishReport,
    JobSpec,
    JobState,
    Resources,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import sim_caps

# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


def spec(**kw: Any) -> JobSpec:
    resources = Resources(gpus=kw.pop("gpus", 0))
    return JobSpec(workload=CommandWorkload(argv=["run"]), resources=resources, **kw)


async def alive_for(cp: ControlPlane, clock: FakeClock, wid: str, seconds: float) -> None:
    """Move the clock, the worker heartbeating all along (the heartbeat timeout is 2 s)."""
    steps = max(1, int(seconds / 0.5))
    for _ in range(steps):
        await clock.advance(seconds / steps)
        await cp.heartbeat(wid)


async def fail_once(cp: ControlPlane, wid: str, job_id: str, code: int = 1) -> None:
    work = await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
    [a] = work.assignments
    assert a.job.id == job_id
    await cp.report_started(wid, job_id, a.attempt)
    failed = FinishReport(state="failed", exit_code=code, reason=f"exit {code}", attempt=a.attempt)
    await cp.report_finished(wid, job_id, failed)


async def test_a_failing_exit_is_not_retried_unless_asked(gl_cp: ControlPlane) -> None:
    wid = (await gl_cp.register(WorkerRegistration(name="w1"))).id
    job = await gl_cp.submit(spec(retries=3))  # retry_on: lost, preempted
    await fail_once(gl_cp, wid, job.id)
    done = await gl_cp.get(job.id)
    assert (done.state, done.attempts) == (JobState.FAILED, 0)
    [a] = done.history
    assert (a.outcome, a.exit_code, a.retried) == ("failed", 1, False)


async def test_chosen_exit_codes_retry_after_a_backoff(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.outcomes.rng = random.Random(7)
    wid = (await gl_cp.register(WorkerRegistration(name="w1"))).id
    job = await gl_cp.submit(spec(retries=2, retry_exit_codes=[3], retry_backoff=10))
    await fail_once(gl_cp, wid, job.id, code=3)
    again = await gl_cp.get(job.id)
    assert (again.state, again.attempts) == (JobState.QUEUED, 1)
    assert again.retry_at is not None
    wait = again.retry_at - gl_clock.now()
    assert 5 <= wait <= 10  # the first retry: a random half of 10 s, plus 5
    said = await gl_cp.explain(job.id)
    assert "waits" in said and "before attempt 1 (retry backoff after failed: exit 3)" in said
    # Not placed before its time; placed right after (a timer runs the pass).
    poll = asyncio.ensure_future(gl_cp.next_work(wid, wait=3600))
    await alive_for(gl_cp, gl_clock, wid, wait - 0.5)
    assert not poll.done()
    await alive_for(gl_cp, gl_clock, wid, 1)
    await until(poll.done, timeout=5)
    assert poll.result().assignments[0].attempt == 1
    # Exit 1 is not one of the chosen codes: the job fails, both attempts on record.
    a = poll.result().assignments[0]
    await gl_cp.report_started(wid, job.id, a.attempt)
    await gl_cp.report_finished(
        wid, job.id, FinishReport(state="failed", exit_code=1, attempt=a.attempt)
    )
    done = await gl_cp.get(job.id)
    assert done.state == JobState.FAILED
    assert [(h.attempt, h.outcome, h.retried) for h in done.history] == [
        (0, "failed", True),
        (1, "failed", False),
    ]


async def test_backoff_doubles_per_attempt_and_is_capped(gl_cp: ControlPlane) -> None:
    job = await gl_cp.submit(
        spec(retries=10, retry_on=["failed"], retry_backoff=4, retry_backoff_max=20)
    )
    gl_cp.outcomes.rng = random.Random(1)
    waits = []
    for n in range(6):
        j = job.model_copy(update={"attempts": n})
        waits.append(gl_cp.outcomes.backoff(j))
    tops = [min(20.0, 4.0 * 2**n) for n in range(6)]
    assert all(top / 2 <= w <= top for w, top in zip(waits, tops, strict=True))
    assert max(waits) <= 20
    # Jitter: two jobs failing together do not come back together.
    assert len({round(gl_cp.outcomes.backoff(job), 6) for _ in range(5)}) > 1


async def test_a_gang_is_retried_only_when_it_asks(gl_cp: ControlPlane) -> None:
    wid = (await gl_cp.register(WorkerRegistration(name="w1", capabilities=sim_caps(2)))).id
    plain = await gl_cp.submit(spec(gpus=2, retries=2, retry_on=["failed"], retry_backoff=0))
    await fail_once(gl_cp, wid, plain.id)
    assert (await gl_cp.get(plain.id)).state == JobState.FAILED
    asked = await gl_cp.submit(
        spec(gpus=2, retries=2, retry_on=["failed"], retry_backoff=0, retry_gang=True)
    )
    await fail_once(gl_cp, wid, asked.id)
    again = await gl_cp.get(asked.id)
    # Retried: its next attempt waits, or a scheduling pass has placed it already.
    assert again.attempts == 1 and again.state in (JobState.QUEUED, JobState.PLACED), again


async def test_a_bad_retry_field_is_refused_naming_it() -> None:
    from gpulayer_kernel.contracts import parse
    from gpulayer_kernel.errors import ValidationFailed

    base = {"workload": {"kind": "command", "argv": ["x"]}}
    with pytest.raises(ValidationFailed, match="retry_on"):
        parse(JobSpec, {**base, "retry_on": ["crashed"]})
    with pytest.raises(ValidationFailed, match="retry_backoff"):
        parse(JobSpec, {**base, "retry_backoff": -1})
