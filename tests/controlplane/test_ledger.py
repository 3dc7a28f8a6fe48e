"""The cost ledger and budgets on a FakeClock: estimates at placement, charges at the end, at most
one charge per attempt however often a report comes, typical durations, the costs report, and
budgets checked at submit, obeyed by the autoscaler and watched while jobs run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import (
    Budget,
    CommandWorkload,
    CostKind,
    FinishReport,
    JobSpec,
    JobState,
    Resources,
    ScalingCode,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import BudgetExceeded
from gpulayer_kernel.providers import parse_config
from gpulayer_kernel.security.roles import Identity, Role
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock

from ..conftest import sim_caps
from .cloud import cloud

ADA = Identity("ada", Role.USER)  # a cost's user is its job's owner, never a label

RATES = {"gpu_hour": 2.0, "workers": {"big-*": 3.0}, "typical_hours": 0.5}


# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


def spec(gpus: int = 1, **kw: Any) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=["run"]), resources=Resources(gpus=gpus), **kw)


def priced(cp: ControlPlane) -> None:
    cp.provisioning.use(parse_config({"costs": RATES}), {})


async def run_job(
    cp: ControlPlane, clock: FakeClock, wid: str, job_id: str, seconds: float
) -> FinishReport:
    work = await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
    [a] = work.assignments
    await cp.report_started(wid, job_id, a.attempt)
    for _ in range(int(seconds)):
        await clock.advance(1)
        await cp.heartbeat(wid)
    done = FinishReport(state="succeeded", exit_code=0, attempt=a.attempt)
    await cp.report_finished(wid, job_id, done)
    return done


async def test_an_attempt_is_estimated_when_placed_and_charged_once_when_it_ends(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    priced(gl_cp)
    wid = (await gl_cp.register(WorkerRegistration(name="big-1", capabilities=sim_caps(2)))).id
    job = await gl_cp.submit(spec(gpus=2, timeout=3600), who=ADA)
    report = await run_job(gl_cp, gl_clock, wid, job.id, 90)
    done = await gl_cp.get(job.id)
    [a] = done.history
    assert (a.units, a.unit_price, a.estimate) == (2.0, 3.0, 6.0)  # 2 GPUs x $3 x 1 h
    assert a.gpu_seconds == pytest.approx(180.0) and a.charge == pytest.approx(0.15)
    # At-least-once: the same report again (a retry after a lost answer) charges nothing more.
    for _ in range(3):
        assert (await gl_cp.report_finished(wid, job.id, report)).state == JobState.SUCCEEDED
    rows = await gl_cp.store.list_costs(job_id=job.id)
    assert sorted(r.kind for r in rows) == [CostKind.CHARGE, CostKind.ESTIMATE]
    report_rows = (await gl_cp.costs("user")).rows
    assert [(r.key, r.charge, r.attempts) for r in report_rows] == [("ada", 0.15, 1)]


async def test_without_a_timeout_the_estimate_is_the_typical_run(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    priced(gl_cp)
    wid = (await gl_cp.register(WorkerRegistration(name="w", capabilities=sim_caps(1)))).id
    first = await gl_cp.submit(spec(name="train"))
    await run_job(gl_cp, gl_clock, wid, first.id, 36)
    assert (await gl_cp.get(first.id)).history[0].estimate == 1.0  # typical_hours 0.5 x $2
    second = await gl_cp.submit(spec(name="train"))
    await run_job(gl_cp, gl_clock, wid, second.id, 1)
    [a] = (await gl_cp.get(second.id)).history
    assert a.estimate_hours == pytest.approx(0.01) and a.estimate == pytest.approx(0.02)


async def test_charges_survive_a_restart_and_are_written_once(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "cp.db"

    async def start() -> ControlPlane:
        store = SqliteStore(path)
        await store.open()
        cp = ControlPlane(store, LocalArtifactStore(tmp_path / "b"), clock=clock)
        await cp.start()
        priced(cp)
        return cp

    cp = await start()
    wid = (await cp.register(WorkerRegistration(name="w", capabilities=sim_caps(1)))).id
    job = await cp.submit(spec(timeout=60))
    await run_job(cp, clock, wid, job.id, 10)
    await cp.close()
    await cp.store.close()
    cp = await start()
    try:
        rows = await cp.store.list_costs(job_id=job.id)
        assert len(rows) == 2 and (await cp.get(job.id)).history[0].charge is not None
        assert (await cp.costs("job")).total_charge == pytest.approx(10 / 3600 * 2.0, abs=1e-6)
    finally:
        await cp.close()
        await cp.store.close()


async def test_a_submit_over_budget_is_refused_with_the_estimate_and_how_to_raise_it(
    gl_cp: ControlPlane,
) -> None:
    priced(gl_cp)
    await gl_cp.register(WorkerRegistration(name="w", capabilities=sim_caps(2)))
    await gl_cp.set_budget(Budget(name="team-a", scope="project", match="vision", limit=3.0))
    ok = await gl_cp.submit(spec(gpus=1, timeout=3600, labels={"project": "vision"}))  # $2
    with pytest.raises(BudgetExceeded) as info:
        await gl_cp.submit(spec(gpus=1, timeout=3600, labels={"project": "vision"}))
    err = info.value
    assert err.code == "budget_exceeded" and err.status == 409
    assert "≈ $2.00 on worker w" in err.message and "$1.00 of $3.00 this month" in err.message
    assert "gpulayer budgets set team-a --limit 4.00" in err.hint
    assert err.details["left"] == pytest.approx(1.0)
    # Other projects are not held back; a budget of 0 refuses anything that costs.
    await gl_cp.submit(spec(gpus=1, timeout=3600, labels={"project": "audio"}))
    await gl_cp.set_budget(Budget(name="none", scope="user", match="bob", limit=0))
    with pytest.raises(BudgetExceeded, match="budget `none`"):
        await gl_cp.submit(spec(gpus=1, timeout=60), who=Identity("bob", Role.USER))
    # A label is not an owner: "user=bob" on the admin's job spends nothing of bob's budget.
    await gl_cp.submit(spec(gpus=1, timeout=60, labels={"user": "bob"}))
    [status] = [s for s in (await gl_cp.budgets()).budgets if s.budget.name == "team-a"]
    assert (status.spent, status.committed, status.left) == (0.0, 2.0, 1.0)
    assert ok.id


@pytest.mark.parametrize("policy", ["warn", "cancel"])
async def test_a_running_job_that_crosses_its_budget_is_warned_or_cancelled(
    gl_cp: ControlPlane, gl_clock: FakeClock, policy: str
) -> None:
    priced(gl_cp)
    wid = (await gl_cp.register(WorkerRegistration(name="w", capabilities=sim_caps(1)))).id
    budget = Budget(name="b", scope="user", match="ada", limit=0.02, policy=policy)  # type: ignore[arg-type]
    await gl_cp.set_budget(budget)
    job = await gl_cp.submit(spec(timeout=30), who=ADA)  # ≈ $0.017
    work = await asyncio.wait_for(gl_cp.next_work(wid, wait=3600), 10)
    await gl_cp.report_started(wid, job.id, work.assignments[0].attempt)
    for _ in range(60):  # $2/h: $0.02 after 36 s; the reaper looks every 0.5 s
        await gl_clock.advance(1)
        await gl_cp.heartbeat(wid)
    texts = [r.text for r in (await gl_cp.logs(job.id)).records]
    crossed = [t for t in texts if "budget `b` is exceeded" in t]
    if policy == "warn":
        assert len(crossed) == 1 and "it goes on (policy warn)" in crossed[0]
        assert (await gl_cp.get(job.id)).state == JobState.RUNNING
    else:
        now = await gl_cp.get(job.id)
        assert now.cancel_requested and "policy cancel" in (now.reason or "")


async def test_the_autoscaler_launches_nothing_a_budget_cannot_pay(tmp_path: Path) -> None:
    # Launches wait 10 s (scale_up_after): time to lower the budget after the submit.
    async with cloud(tmp_path, autoscale={"scale_up_after": 10}) as c:
        cp = c.cp
        await cp.set_budget(Budget(name="tight", scope="project", match="q", limit=10))
        job = await cp.submit(
            JobSpec(
                workload=CommandWorkload(argv=["sleep", "1"]),
                resources=Resources(gpus=2),
                timeout=3600,  # ≈ $4.20 on fake/a100x2: within $10
                labels={"project": "q"},
            )
        )
        await cp.set_budget(Budget(name="tight", scope="project", match="q", limit=1))

        def note() -> ScalingCode | None:
            j = cp.jobs.active_job(job.id)
            return j.pending.scaling.code if j and j.pending and j.pending.scaling else None

        await c.run_until(lambda: note() == ScalingCode.OVER_BUDGET, most=15)
        assert cp.provisioning.instances.live() == []
        said = await cp.explain(job.id)
        assert "would exceed budget `tight` (≈ $4.20 needed, $1.00 left)" in said, said
        # Raised again: the machine is launched.
        await cp.set_budget(Budget(name="tight", scope="project", match="q", limit=10))
        await c.run_until(lambda: cp.provisioning.instances.live(), most=3)
