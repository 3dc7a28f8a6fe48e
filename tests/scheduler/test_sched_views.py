"""The control plane's snapshots reuse what did not change (views.py), and say the same thing."""

from __future__ import annotations

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, Resources, WorkerState
from gpulayer_kernel.contracts import WorkerRegistration as Registration
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.scheduler.views import Views
from gpulayer_kernel.testing import until

from ..conftest import sim_caps

# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


async def handed_out(cp: ControlPlane, job_id: str) -> None:
    """Until the job is placed, written and counted on its worker (its record then settles)."""

    def counted() -> bool:
        return any(job_id in w.running for w in cp.registry.live())

    await until(counted, what=f"job {job_id} on its worker")


def one_gpu(name: str) -> JobSpec:
    return JobSpec(name=name, workload=CommandWorkload(argv=["true"]), resources=Resources(gpus=1))


async def test_a_snapshot_reuses_the_views_of_workers_that_did_not_change(
    gl_cp: ControlPlane,
) -> None:
    a = (await gl_cp.register(Registration(name="a", capabilities=sim_caps(2)))).id
    b = (await gl_cp.register(Registration(name="b", capabilities=sim_caps(2)))).id
    first = await gl_cp.submit(one_gpu("first"))
    await handed_out(gl_cp, first.id)
    one, two = gl_cp.snapshot(), gl_cp.snapshot()
    assert all(x is y for x, y in zip(one.workers, two.workers, strict=True))
    # Built afresh, it says exactly the same.
    gl_cp.scheduling.views = Views()
    assert gl_cp.snapshot() == two

    second = await gl_cp.submit(one_gpu("second"))
    await handed_out(gl_cp, second.id)
    three = gl_cp.snapshot()
    before = {w.id: w for w in gl_cp.snapshot().workers}
    after = {w.id: w for w in three.workers}
    busier = {r.id for r in after[a].running} | {r.id for r in after[b].running}
    assert busier == {first.id, second.id}
    changed = [w for w in (a, b) if second.id in {r.id for r in after[w].running}]
    [same] = [w for w in (a, b) if w not in changed]
    assert after[same] is before[same]  # the other worker: the very same view

    # A worker whose record changed (cordoned) gets a new view; the other keeps its own.
    await gl_cp.set_worker_state(same, WorkerState.CORDONED)
    four = {w.id: w for w in gl_cp.snapshot().workers}
    assert four[same] is not after[same] and four[same].state == WorkerState.CORDONED
    assert four[changed[0]] is after[changed[0]]
    gl_cp.scheduling.views = Views()
    assert {w.id: w for w in gl_cp.snapshot().workers} == four
