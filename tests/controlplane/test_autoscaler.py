"""The autoscaler part on a FakeClock: launch for a waiting job, join, run, idle scale-down,
boot failures with backoff, boot deadlines, preemption, strays, and what explanations say."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    Instance,
    InstanceState,
    JobSpec,
    JobState,
    Offer,
    Resources,
    ScalingCode,
)
from gpulayer_kernel.errors import Unauthorized
from gpulayer_kernel.providers import LaunchSpec
from gpulayer_kernel.security import TokenKind

from .cloud import Cloud, cloud, silent_machine


def job(*argv: str, gpus: int = 2, **kw: object) -> JobSpec:
    return JobSpec(
        workload=CommandWorkload(argv=list(argv)),
        resources=Resources(gpus=gpus),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
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
        await c.run_until(lambda: cp.registry.all() == [], most=5)  # it left, then is forgotten


def live(c: Cloud) -> list[Instance]:
    return c.cp.provisioning.instances.live()


def states(c: Cloud) -> list[InstanceState]:
    return [i.state for i in c.cp.provisioning.instances.all().values()]


async def test_a_launch_that_hangs_times_out_backs_off_and_says_so(tmp_path: Path) -> None:
    async with cloud(tmp_path, launch_hangs=True) as c:
        cp = c.cp
        j = await cp.submit(job("sleep", "1"))
        # launch_timeout is 5 s: the first launch fails at 5 s, the provider backs off.
        await c.run_until(lambda: InstanceState.FAILED in states(c), most=10)
        [failed] = [i for i in cp.provisioning.instances.all().values()]
        assert "fake's launch did not answer within 5s" in (failed.reason or "")
        st = cp.provisioning.autoscaler.state["fake"]  # type: ignore[union-attr]
        assert st.failures == 1 and st.backoff_until is not None
        await c.run_until(
            lambda: (
                (cp.jobs.active_job(j.id).pending or object()).scaling.code  # type: ignore[union-attr]
                == ScalingCode.PROVIDER_BACKOFF
            ),
            most=2,
        )
        said = await cp.explain(j.id)
        assert "launch(es) failed (launch failed: fake's launch did not answer" in said, said
        assert "next try in" in said
        # The token minted for the failed launch is revoked: nothing can join with it.
        assert c.tokens.get(failed.token_id or "").revoked


async def test_a_machine_that_never_joins_is_ended_at_its_boot_deadline(tmp_path: Path) -> None:
    async with cloud(tmp_path, start_machine=silent_machine, max_instances=1) as c:
        await c.cp.submit(job("sleep", "1"))
        await c.run_until(lambda: live(c), most=2)
        [inst] = live(c)
        # boot_timeout 30 s: then failed, ended at the provider, backoff counted.
        await c.run_until(lambda: InstanceState.FAILED in states(c), most=40)
        ended = c.cp.provisioning.instances.get(inst.id)
        assert ended is not None and "did not join within 30s" in (ended.reason or "")
        await c.run_until(lambda: inst.external_id not in c.provider.live(), most=3)
        assert c.cp.provisioning.autoscaler.state["fake"].failures >= 1  # type: ignore[union-attr]


async def test_a_worker_with_a_spent_or_revoked_instance_token_is_refused(tmp_path: Path) -> None:
    async with cloud(tmp_path) as c:
        await c.cp.submit(job("sleep", "100"))
        await c.run_until(lambda: [i for i in live(c) if i.state == InstanceState.JOINED], most=20)
        [inst] = live(c)
        rec = c.tokens.get(inst.token_id or "")
        assert rec.used
        # The token's secret was given to the machine only; a replay of a spent id fails too.
        with pytest.raises(Unauthorized) as info:
            await c.tokens.authenticate(f"glt_i_{rec.id}_guessed", {TokenKind.INSTANCE})
        assert info.value.code == "token_invalid"
        # A machine launched and failed: its token is revoked before anyone can use it.
        _, secret = await c.tokens.create(TokenKind.INSTANCE, name="by hand")
        rid = secret.split("_")[2]
        await c.tokens.revoke(rid)
        with pytest.raises(Unauthorized) as info:
            await c.tokens.authenticate(secret, {TokenKind.INSTANCE})
        assert info.value.code == "token_revoked"


async def test_a_preempted_machine_s_job_is_lost_as_preempted_then_retried(
    tmp_path: Path,
) -> None:
    async with cloud(tmp_path) as c:
        cp = c.cp
        spec = job("sleep", "100", gpus=1, retries=1, retry_backoff=4)
        j = await cp.submit(spec)
        await c.run_until(lambda: cp.jobs.cached(j.id).state == JobState.RUNNING, most=20)  # type: ignore[union-attr]
        [inst] = live(c)
        await c.clock.advance(10)
        await c.provider.preempt(inst.id)
        await c.run_until(lambda: cp.jobs.cached(j.id).attempts == 1, most=5)  # type: ignore[union-attr]
        again = await cp.get(j.id)
        first = again.history[0]
        assert first.outcome == "preempted" and first.retried
        assert (first.reason or "").startswith("preempted: worker fake-")
        assert first.charge is not None and first.charge > 0  # 10 s of one GPU
        assert again.retry_at is not None  # backoff: 2..4 s
        assert "retry backoff" in await cp.explain(j.id)
        assert cp.provisioning.instances.get(inst.id).state == InstanceState.PREEMPTED  # type: ignore[union-attr]
        await c.run_until(lambda: cp.jobs.cached(j.id).state == JobState.RUNNING, most=30)  # type: ignore[union-attr]
        assert len(live(c)) == 1 and live(c)[0].id != inst.id


async def test_a_gang_whose_machine_is_preempted_ends_lost_and_is_not_retried(
    tmp_path: Path,
) -> None:
    one = {"name": "a100x1", "gpus": 1, "gpu_kind": "a100", "price_per_hour": 2.1}
    async with cloud(tmp_path, offers=[one]) as c:
        cp = c.cp
        spec = JobSpec(
            workload=CommandWorkload(argv=["sleep", "100"]),
            resources=Resources(gpus=1, nodes=2),
            retries=3,
        )
        j = await cp.submit(spec)
        await c.run_until(lambda: len(live(c)) == 2, most=2)
        await c.run_until(lambda: cp.jobs.cached(j.id).state == JobState.RUNNING, most=20)  # type: ignore[union-attr]
        await c.provider.preempt(live(c)[0].id)
        await c.run_until(lambda: cp.jobs.cached(j.id).state.terminal, most=5)  # type: ignore[union-attr]
        done = await cp.get(j.id)
        assert done.state == JobState.LOST and (done.reason or "").startswith("preempted:")
        assert done.attempts == 0  # a gang fails fast: no retry unless it asks (retry_gang)


async def test_a_machine_the_control_plane_does_not_know_is_ended(tmp_path: Path) -> None:
    async with cloud(tmp_path) as c:
        offer = (await c.provider.offers())[0]
        how = LaunchSpec("0123456789ab", "stray", "http://127.0.0.1:1")
        await c.provider.launch_stray(offer, how)
        assert len(c.provider.live()) == 1
        await c.run_until(lambda: c.provider.live() == [], most=5)
        assert live(c) == []


@pytest.mark.parametrize("killed", ["before the provider heard", "before it answered"])
async def test_a_control_plane_killed_mid_launch_launches_nothing_twice(
    tmp_path: Path, killed: str
) -> None:
    """Launches are recorded before they are made: after a restart, a launch its provider
    never heard of is failed (and made again), one it heard of is adopted, never repeated."""
    home, db = tmp_path / "provider", tmp_path / "cp.db"
    delay = {"launch_delay": 3} if killed.startswith("before the provider") else {"answer_delay": 3}
    quiet = {"reconcile_every": 100}  # no round adopts it before the control plane stops
    async with cloud(tmp_path, home=home, path=db, autoscale=quiet, **delay) as c:
        j = await c.cp.submit(job("sleep", "5"))
        heard = not killed.startswith("before the provider")
        # The launch call is made (its token minted), and the provider has it or not yet.
        await c.run_until(
            lambda: live(c) and live(c)[0].token_id and bool(c.provider.live()) == heard,
            most=2,
            step=0.1,
        )
        await c.clock.advance(1)  # mid-launch: the control plane stops here
        [first] = live(c)
        assert first.state == InstanceState.REQUESTED and first.external_id is None
    async with cloud(tmp_path, home=home, path=db) as c:
        cp = c.cp
        await c.run_until(lambda: cp.jobs.cached(j.id).state == JobState.SUCCEEDED, most=60)  # type: ignore[union-attr]
        records = {i.id: i for i in await cp.store.load_instances(ended=True)}
        if killed.startswith("before the provider"):
            assert records[first.id].state == InstanceState.FAILED
            assert "never launched" in (records[first.id].reason or "")
            assert len(records) == 2 and c.provider.launches == 1
        else:
            assert list(records) == [first.id]  # adopted, booted, joined: the one machine
            assert records[first.id].external_id is not None
            assert c.provider.launches == 0  # this life launched nothing


async def test_a_provider_whose_offers_fail_is_down_and_the_job_is_told_why(
    tmp_path: Path,
) -> None:
    from gpulayer_kernel.providers.config import no_price

    async def unpriced() -> list[Offer]:
        raise no_price("providers.fake.offers[0].price_per_hour", "an offer without a price")

    async with cloud(tmp_path) as c:
        c.provider.offers = unpriced  # type: ignore[method-assign]
        await c.cp.provisioning.autoscaler.reconciler.refresh()  # type: ignore[union-attr]
        j = await c.cp.submit(job("sleep", "1", wait_for_capacity=True))

        def noted() -> bool:
            pending = c.cp.jobs.active_job(j.id).pending  # type: ignore[union-attr]
            return pending is not None and pending.scaling is not None

        await c.run_until(noted, most=2)
        said = await c.cp.explain(j.id)
        # Its last offers are kept (it may come back): they fit, but it cannot launch now.
        assert "fake/a100x2 could launch one (≈ $4.20/h, ~5 s), but fake cannot launch now" in said
        assert "price_per_hour: field required" in said and live(c) == []
        # Never read at all: nothing is known to fit, and the note says why.
        c.cp.provisioning.autoscaler.state["fake"].offers = []  # type: ignore[union-attr]
        await c.run_until(
            lambda: (
                "no provider can offer"
                in c.cp.scheduling.explain(
                    c.cp.jobs.active_job(j.id)  # type: ignore[arg-type]
                )
            ),
            most=3,
        )
        assert "(fake: providers.toml:" in await c.cp.explain(j.id)


async def test_a_launch_answered_while_the_machines_are_listed_is_not_taken_for_gone(
    tmp_path: Path,
) -> None:
    """A round lists the machines, then compares: a launch that answered in between is absent
    from that listing only because the listing is older (an SSH fleet's CI run failed a booting
    box as "no longer reported" and launched it again)."""
    from gpulayer_kernel.providers import Census

    quiet = {"reconcile_every": 1000}  # this test runs the one round itself
    async with cloud(tmp_path, autoscale=quiet) as c:
        real = c.provider.instances
        listed, go = asyncio.Event(), asyncio.Event()

        async def slow_listing() -> Census:
            census = await real()  # what the provider saw when asked: no machine yet
            listed.set()
            await go.wait()
            return census

        c.provider.instances = slow_listing  # type: ignore[method-assign]
        rnd = asyncio.create_task(c.cp.provisioning.autoscaler.reconciler.round())  # type: ignore[union-attr]
        await listed.wait()
        await c.cp.submit(job("sleep", "1"))
        await c.run_until(lambda: [i for i in live(c) if i.state == InstanceState.BOOTING], most=3)
        go.set()
        await rnd
        assert states(c) == [InstanceState.BOOTING], [i.reason for i in live(c)]
