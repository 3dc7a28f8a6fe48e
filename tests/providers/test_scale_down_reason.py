"""An idle machine's end keeps its reason when its worker leaves before the provider's
terminate answers (an SSH host waits for the worker to exit; found by the failover test on the
SSH fleet): the reconciler leaves an instance being ended to its scale-down, instead of writing
"scaled down" over "idle for 30s" and logging it as a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, InstanceState, JobSpec, JobState, Resources

from ..controlplane.cloud import cloud


@pytest.mark.parametrize("delay", [3, 8], ids=["late", "past-the-bound"])
async def test_an_idle_machine_whose_worker_leaves_first_ends_idle_not_scaled_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, delay: float
) -> None:
    caplog.set_level(logging.INFO, "gpulayer")
    # Terminate answers ``delay`` s after the machine stopped (reconciler rounds every 1 s see
    # its worker gone meanwhile); 8 s is past the 5 s bound, so the scale-down never hears back.
    async with cloud(tmp_path, terminate_delay=delay) as c:
        cp = c.cp
        spec = JobSpec(workload=CommandWorkload(argv=["true"]), resources=Resources(gpus=2))
        j = await cp.submit(spec)
        await c.run_until(lambda: cp.jobs.cached(j.id).state.terminal, most=60)  # type: ignore[union-attr]
        [inst] = cp.provisioning.instances.all().values()

        def ended() -> bool:
            now = cp.provisioning.instances.get(inst.id)
            return now is not None and now.state.ended

        await c.run_until(ended, most=60)
        done = cp.provisioning.instances.get(inst.id)
        stored = {i.id: i for i in await cp.store.load_instances(ended=True)}[inst.id]
    assert cp.jobs.cached(j.id).state == JobState.SUCCEEDED  # type: ignore[union-attr]
    for i in (done, stored):
        assert i is not None and i.state == InstanceState.TERMINATED
        assert (i.reason or "").startswith("idle for"), i.reason
    assert "scaled down" not in caplog.text
    assert not [r for r in caplog.records if "idle for" in r.message and r.levelno > logging.INFO]
