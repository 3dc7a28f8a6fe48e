"""The autoscaler part on a FakeClock: launch for a waiting job, join, run, idle scale-down,
boot failures with backoff, boot deadlines, preemption, strays, and what explanations say."""

from __future__ import annotations

from pathlib import Path

from gpulayer_kernel.contracts import (
    CommandWorkload,
    InstanceState,
    JobSpec,
    JobState,
    Resources,
    ScalingCode,
)

from .cloud import cloud


def job(*argv: str, gpus: int = 2, **kw: object) -> JobSpec:
    return JobSpec(
        workload=CommandWorkload(argv=list(argv)), resources=Resources(gpus=gpus), **kw  # type: ignore[arg-type]
    )


async def test_a_waiting_job_launches_a_machine_runs_and_the_idle_machine_ends(
    tmp_path: Path,
) -> None:
    async with cloud(tmp_path) as c:
        cp = c.cp
        j = await cp.submit(job("sleep", "20"))
        await c.run_until(lambda: cp.provisioning.instances.live(), most=5)
        [inst] = cp.provisioning.instances.live()
        assert inst.offer.id == "fake/a100x2" and inst.for_jobs == [j.id]
        said = await cp.explain(j.id)
        assert "fake/a100x2 can launch one (≈ $4.20/h, ~5 s)" in said, said
        await c.run_until(lambda: cp.jobs.cached(j.id).state == JobState.RUNNING, most=30)  # type: ignore[union-attr]
        assert cp.provisioning.instances.get(inst.id).state == InstanceState.JOINED  # type: ignore[union-attr]
        await c.run_until(lambda: cp.jobs.cached(j.id).state.terminal, most=60)  # type: ignore[union-attr]
        done = await cp.get(j.id)
        assert done.state == JobState.SUCCEEDED
        [a] = done.history
        assert a.instances == [inst.id] and a.provider == "fake"
        assert a.estimate > 0 and a.charge is not None
        # 20 s of 2 GPUs at $2.10 per GPU-hour.
        assert abs(a.charge - 20 * 2 * 2.1 / 3600) < 1e-3
        # Idle past idle_timeout (30 s): the machine ends and its worker is forgotten.
        await c.run_until(
            lambda: cp.provisioning.instances.get(inst.id).state == InstanceState.TERMINATED,  # type: ignore[union-attr]
            most=60,
        )
        assert c.provider.live() == []
        assert await cp.workers() == []
