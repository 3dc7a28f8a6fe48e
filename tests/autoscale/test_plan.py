"""``plan_scaling``: the cheapest offer that fits, packing, limits, budgets, notes, scale-down,
and the same snapshot giving the same plan."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer_kernel.autoscale import (
    InstanceView,
    PendingJob,
    ProviderView,
    ScalingSnapshot,
    plan_scaling,
)
from gpulayer_kernel.contracts import InstanceState, Offer, Resources, ScalingCode
from gpulayer_kernel.scheduler.explain import scaling_sentence

NOW = 1_000.0


def offer(name: str, gpus: int, price: float, *, kind: str = "a100", **kw: Any) -> Offer:
    return Offer(
        provider=kw.pop("provider", "p"),
        name=name,
        gpus=gpus,
        gpu_kind=kind if gpus else "",
        gpu_memory=80 << 30 if gpus else 0,
        price_per_hour=price,
        boot_seconds=kw.pop("boot", 30.0),
        **kw,
    )


def pending(jid: str, gpus: int = 1, seq: int = 0, **kw: Any) -> PendingJob:
    hours = kw.pop("hours", 1.0)
    budgets = kw.pop("budgets", ())
    return PendingJob(jid, seq, 0, Resources(gpus=gpus, **kw), NOW - 10, hours, budgets)


def snap(*jobs: PendingJob, max_instances: int = 10, **kw: Any) -> ScalingSnapshot:
    providers = kw.pop("providers", {"p": ProviderView("p", max_instances)})
    return ScalingSnapshot(now=NOW, pending=jobs, providers=providers, **kw)


def test_the_cheapest_offer_that_fits_is_launched_and_said() -> None:
    offers = [offer("big", 8, 20.0), offer("two", 2, 4.2), offer("one", 1, 2.1)]
    plan = plan_scaling(snap(pending("j", gpus=2)), offers, {})
    assert [launch.offer.name for launch in plan.launches] == ["two"]
    note = plan.notes["j"]
    assert note.code == ScalingCode.LAUNCHING and note.offer == "p/two"
    assert scaling_sentence(note) == "p/two can launch one (≈ $4.20/h, ~30 s): launching it"


def test_later_jobs_pack_into_the_machine_launched_for_an_earlier_one() -> None:
    offers = [offer("four", 4, 8.0)]
    jobs = [pending(f"j{i}", gpus=2, seq=i) for i in range(3)]
    plan = plan_scaling(snap(*jobs), offers, {})
    assert len(plan.launches) == 2  # j0 and j1 share one, j2 gets the second
    assert {plan.notes[j].code for j in ("j0", "j1", "j2")} == {ScalingCode.LAUNCHING}


def test_a_booting_machine_takes_the_job_and_nothing_new_is_launched() -> None:
    o = offer("two", 2, 4.2)
    booting = InstanceView("3f2a9c1d0000", "p", o, InstanceState.BOOTING, NOW - 5, NOW + 600)
    plan = plan_scaling(snap(pending("j", gpus=2), instances=(booting,)), [o], {})
    assert plan.launches == ()
    note = plan.notes["j"]
    assert note.code == ScalingCode.BOOTING and note.instances == ["3f2a9c1d0000"]
    assert "instance 3f2a9c1d of p/two is booting for it (~25 s left)" in scaling_sentence(note)


def test_limits_money_and_budgets_stop_a_launch_and_the_note_says_which() -> None:
    o = offer("two", 2, 4.2)
    full = InstanceView("a" * 12, "p", o, InstanceState.JOINED, NOW - 99, NOW)
    limit = plan_scaling(snap(pending("j", 2), max_instances=1, instances=(full,)), [o], {})
    assert limit.launches == () and limit.notes["j"].code == ScalingCode.PROVIDER_LIMIT
    assert "p is at its limit of 1 instances" in scaling_sentence(limit.notes["j"])

    price = plan_scaling(snap(pending("j", 2), max_price_per_hour=4.0), [o], {})
    assert price.notes["j"].code == ScalingCode.MAX_PRICE
    assert "pass the max of $4.00/h" in scaling_sentence(price.notes["j"])

    job = pending("j", 2, hours=2.0, budgets=("team-a",))
    broke = plan_scaling(snap(job), [o], {"team-a": 3.2})
    note = broke.notes["j"]
    assert broke.launches == () and note.code == ScalingCode.OVER_BUDGET
    assert (note.budget, note.budget_left, note.estimate) == ("team-a", 3.2, 8.4)
    assert "exceed budget `team-a` (≈ $8.40 needed, $3.20 left)" in scaling_sentence(note)
    zero = plan_scaling(snap(job), [o], {"team-a": 0.0})
    assert zero.notes["j"].code == ScalingCode.OVER_BUDGET


def test_a_backing_off_or_down_provider_launches_nothing() -> None:
    o = offer("two", 2, 4.2)
    back = {"p": ProviderView("p", 9, backoff_until=NOW + 40, failures=3, last_error="boom")}
    plan = plan_scaling(snap(pending("j", 2), providers=back), [o], {})
    assert plan.notes["j"].code == ScalingCode.PROVIDER_BACKOFF
    assert "its last 3 launch(es) failed (boom); next try in 40 s" in scaling_sentence(
        plan.notes["j"]
    )
    down = {"p": ProviderView("p", 9, down="sinfo failed")}
    plan = plan_scaling(snap(pending("j", 2), providers=down), [o], {})
    assert plan.notes["j"].code == ScalingCode.PROVIDER_ERROR


def test_a_job_no_offer_fits_is_told_so_and_launches_nothing() -> None:
    plan = plan_scaling(snap(pending("j", 4, gpu_kind=["h100"])), [offer("two", 2, 4.2)], {})
    assert plan.launches == () and plan.notes["j"].code == ScalingCode.NO_OFFER
    assert scaling_sentence(plan.notes["j"]) == (
        "no provider offers a machine for it (it needs 4 GPUs of kind h100)"
    )


def test_an_offer_s_capacity_and_a_gang_s_nodes() -> None:
    host = offer("box1", 2, 1.0, capacity=1)
    gang = pending("g", 2, nodes=2)
    plan = plan_scaling(snap(gang), [host], {})
    assert plan.launches == () and plan.notes["g"].code == ScalingCode.PROVIDER_LIMIT
    plan = plan_scaling(snap(gang), [offer("two", 2, 4.2)], {})
    assert len(plan.launches) == 2 and plan.notes["g"].machines == 2


def test_idle_machines_past_the_timeout_are_terminated_busy_ones_not() -> None:
    o = offer("two", 2, 4.2)
    idle = InstanceView("a" * 12, "p", o, InstanceState.JOINED, 0, 0, 10, idle_since=NOW - 301)
    fresh = InstanceView("b" * 12, "p", o, InstanceState.JOINED, 0, 0, 10, idle_since=NOW - 5)
    busy = InstanceView("c" * 12, "p", o, InstanceState.JOINED, 0, 0, 10, idle_since=None)
    plan = plan_scaling(snap(instances=(idle, fresh, busy), idle_timeout=300), [o], {})
    assert [t.instance_id for t in plan.terminations] == ["a" * 12]


jobs_st = st.lists(
    st.tuples(st.integers(0, 4), st.integers(1, 2), st.sampled_from(["a100", "h100", ""])),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_st, limit=st.integers(0, 6), budget=st.floats(0, 50))
def test_the_same_snapshot_gives_the_same_plan_and_limits_hold(
    jobs: list[tuple[int, int, str]], limit: int, budget: float
) -> None:
    offers = [offer("one", 1, 2.0), offer("four", 4, 7.0), offer("h", 2, 9.0, kind="h100")]
    pend = tuple(
        pending(f"j{i}", g, i, nodes=n if g else 1, gpu_kind=[k] if k else [], budgets=("b",))
        for i, (g, n, k) in enumerate(jobs)
    )
    s = snap(*pend, max_instances=limit)
    one, two = plan_scaling(s, offers, {"b": budget}), plan_scaling(s, offers, {"b": budget})
    assert one == two
    assert len(one.launches) <= limit
    spent = sum(
        n.estimate or 0
        for n in one.notes.values()
        if n.code in (ScalingCode.LAUNCHING, ScalingCode.BOOTING)
    )
    assert spent <= budget + 1e-6  # what was planned for them fits in the budget
    assert set(one.notes) <= {j.id for j in pend}
