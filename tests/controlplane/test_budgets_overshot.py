"""A budget overshot by a running job (issue 23, item 6): free jobs still go, and what is left
reads $0.00, never $-0.00."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpulayer_kernel.cli.providers import budgets_text
from gpulayer_kernel.contracts import (
    Budget,
    CommandWorkload,
    FinishReport,
    JobSpec,
    Resources,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import BudgetExceeded
from gpulayer_kernel.providers import parse_config
from gpulayer_kernel.security.roles import Identity, Role
from gpulayer_kernel.testing import FakeClock
from gpulayer_kernel.words import dollars

from ..conftest import sim_caps

ADA = Identity("ada", Role.USER)


# gl_clock (the clock of gl_cp and gl_worker) is a FakeClock in every test of this module.
pytestmark = pytest.mark.gl_fake_clock


def spec(worker: str | None = None, kinds: tuple[str, ...] = (), **kw: Any) -> JobSpec:
    resources = Resources(gpus=1, worker=worker, gpu_kind=list(kinds))
    return JobSpec(workload=CommandWorkload(argv=["run"]), resources=resources, **kw)


async def overshoot(cp: ControlPlane, clock: FakeClock) -> None:
    """ada's $0.02 budget, overshot by a fraction of a cent by one job on the priced worker."""
    cp.provisioning.use(parse_config({"costs": {"gpu_hour": 2.0, "workers": {"free": 0.0}}}), {})
    wid = (await cp.register(WorkerRegistration(name="paid", capabilities=sim_caps(1)))).id
    await cp.set_budget(Budget(name="ada", scope="user", match="ada", limit=0.02))
    job = await cp.submit(spec(timeout=30, worker="paid"), who=ADA)  # ≈ $0.017: it fits
    work = await asyncio.wait_for(cp.next_work(wid, wait=3600), 10)
    attempt = work.assignments[0].attempt
    await cp.report_started(wid, job.id, attempt)
    for _ in range(37):  # $2/h: 37 s is $0.0206, past $0.02 by less than a cent
        await clock.advance(1)
        await cp.heartbeat(wid)
    done = FinishReport(state="succeeded", exit_code=0, attempt=attempt)
    await cp.report_finished(wid, job.id, done)


async def test_an_overshot_budget_refuses_paid_jobs_and_never_free_ones(
    gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    await overshoot(gl_cp, gl_clock)
    [status] = (await gl_cp.budgets()).budgets
    assert -0.01 < status.left < 0  # overshot, by less than a cent
    # A paid job is refused, and the message says what is left as $0.00, never $-0.00.
    with pytest.raises(BudgetExceeded) as info:
        await gl_cp.submit(spec(timeout=30, worker="paid"), who=ADA)
    said = info.value.message
    assert "has left: $0.00 of $0.02 this month" in said and "$-" not in said, said
    # A job that costs nothing (a free worker, or nowhere to run yet: quoted 0) is never refused.
    await gl_cp.register(WorkerRegistration(name="free", capabilities=sim_caps(1)))
    free = await gl_cp.submit(spec(timeout=3600, worker="free"), who=ADA)
    assert free.owner == "ada"
    nowhere = await gl_cp.submit(
        spec(kinds=("h100",), timeout=3600, wait_for_capacity=True), who=ADA
    )
    assert nowhere.owner == "ada"
    # The table `gpulayer budgets` prints: LEFT is $0.00.
    table = budgets_text((await gl_cp.budgets()).budgets)
    assert "$-" not in table and "-$" not in table
    assert table.splitlines()[1].split()[5] == "$0.00", table


def test_dollars_has_no_negative_zero_and_keeps_real_signs() -> None:
    assert dollars(-0.0004) == "$0.00"
    assert dollars(-0.0) == "$0.00"
    assert dollars(-3.1) == "-$3.10"
    assert dollars(1204.5) == "$1,204.50"
    assert dollars(1204.5, short=True) == "$1,204"
    assert dollars(0.004) == "$0.00"
