"""Fair share and quotas (scheduler/share.py): examples with their sentences, and properties.

Properties: a quota is never exceeded by what a pass places; no user starves (every user's
oldest job is in the first turn, and in repeated passes every user with work gets a GPU within
ceil(users / GPUs) passes); the same snapshot gives the same plan.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer_kernel.scheduler import Snapshot, schedule
from gpulayer_kernel.scheduler.share import fair_order, gpus_of
from gpulayer_kernel.scheduler.testing import gpu_worker, job, running, snapshot

USERS = ["alice", "bob", "carol", "dave"]


def test_one_user_keeps_submission_order() -> None:
    jobs = [job(f"j{i}", seq=i, gpus=1) for i in (3, 1, 2)]
    assert [j.id for j in fair_order(snapshot([], jobs))] == ["j1", "j2", "j3"]


def test_users_take_turns_least_recent_use_first() -> None:
    jobs = [
        job("a1", 1, 1, owner="alice"),
        job("a2", 2, 1, owner="alice"),
        job("a3", 3, 1, owner="alice"),
        job("b1", 4, 1, owner="bob"),
        job("b2", 5, 1, owner="bob"),
        job("c1", 6, 1, owner="carol"),
        job("urgent", 7, 1, owner="alice", priority=5),
    ]
    snap = snapshot([], jobs, usage={"alice": 900.0, "bob": 10.0})  # carol: none at all
    order = [j.id for j in fair_order(snap)]
    assert order == ["urgent", "c1", "b1", "a1", "b2", "a2", "a3"]


def test_a_waiting_job_says_fair_share_put_others_ahead() -> None:
    jobs = [job("a1", 1, 1, owner="alice"), job("b1", 2, 1, owner="bob")]
    jobs += [job("c1", 3, 1, owner="carol"), job("a2", 4, 1, owner="alice")]
    snap = snapshot([gpu_worker("w", 1)], jobs, usage={"alice": 500.0, "bob": 1.0})
    plan = schedule(snap)
    assert [a.job_id for a in plan.assignments] == ["c1"]
    a1 = plan.pending["a1"]
    assert a1.fair_share == "behind 2 jobs of users with less recent use"
    assert a1.sentence.endswith(
        "; behind 2 jobs of users with less recent use; position 2 in the queue"
    )
    a2 = plan.pending["a2"]
    assert a2.fair_share is None  # its own turn comes after every earlier job's
    assert plan.pending["b1"].fair_share == "behind 1 job of users with less recent use"


def test_a_user_at_their_quota_waits_and_another_user_takes_the_gpus() -> None:
    busy = gpu_worker("w1", 8, running=[running("r", range(4), owner="alice")])
    jobs = [job("a1", 1, 1, owner="alice"), job("b1", 2, 1, owner="bob")]
    snap = snapshot([busy], jobs, gpu_quotas={"user:alice": 4})
    plan = schedule(snap)
    assert [a.job_id for a in plan.assignments] == ["b1"]
    report = plan.pending["a1"]
    assert report.quota == "alice is at their quota (4/4 GPUs)"
    assert report.waiting_helps and not report.never_fits
    assert "alice is at their quota (4/4 GPUs; waiting helps)" in report.sentence


def test_a_group_quota_counts_every_member() -> None:
    busy = gpu_worker("w1", 8, running=[running("r", range(3), owner="bob")])
    jobs = [job("a1", 1, 2, owner="alice"), job("c1", 2, 1, owner="carol")]
    groups = {"alice": "vision", "bob": "vision"}
    plan = schedule(snapshot([busy], jobs, gpu_quotas={"group:vision": 4}, groups=groups))
    assert [a.job_id for a in plan.assignments] == ["c1"]
    assert plan.pending["a1"].quota == (
        "group vision would pass its quota (3/4 GPUs, the job needs 2)"
    )


def test_jobs_placed_in_one_pass_count_against_the_quota() -> None:
    jobs = [job(f"a{i}", i, 1, owner="alice") for i in range(5)]
    plan = schedule(snapshot([gpu_worker("w1", 8)], jobs, gpu_quotas={"user:alice": 3}))
    assert len(plan.assignments) == 3
    assert plan.pending["a3"].quota == "alice is at their quota (3/3 GPUs)"


# -- properties -------------------------------------------------------------------------------


@st.composite
def shared_clusters(draw: st.DrawFn) -> Snapshot:
    users = USERS[: draw(st.integers(1, 4))]
    workers = []
    n = 0
    for w in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, 8))
        taken = draw(st.integers(0, size))
        runs = [running(f"r{w}-{d}", [d], owner=draw(st.sampled_from(users))) for d in range(taken)]
        workers.append(gpu_worker(f"w{w}", size, running=runs))
    jobs = []
    for _ in range(draw(st.integers(0, 25))):
        n += 1
        gpus = draw(st.integers(0, 4))
        jobs.append(
            job(
                f"j{n}",
                n,
                gpus,
                owner=draw(st.sampled_from(users)),
                priority=draw(st.sampled_from([0, 0, 0, 1])),
            )
        )
    quotas = {f"user:{u}": draw(st.integers(0, 8)) for u in users if draw(st.booleans())}
    groups = {u: "team" for u in users if draw(st.booleans())}
    if groups and draw(st.booleans()):
        quotas["group:team"] = draw(st.integers(0, 10))
    usage = {u: float(draw(st.integers(0, 10_000))) for u in users}
    return snapshot(workers, jobs, usage=usage, gpu_quotas=quotas, groups=groups)


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_clusters())
def test_a_pass_never_places_past_a_quota(snap: Snapshot) -> None:
    plan = schedule(snap)
    jobs = {j.id: j for j in snap.pending}
    for subject, cap in snap.gpu_quotas.items():
        kind, name = subject.split(":", 1)

        def counts(owner: str, subject: str = subject) -> bool:
            if subject.startswith("user:"):
                return owner == subject[5:]
            return snap.groups.get(owner) == subject[6:]

        held = sum(len(r.devices) for w in snap.workers for r in w.running if counts(r.owner))
        placed = sum(
            gpus_of(jobs[a.job_id]) for a in plan.assignments if counts(jobs[a.job_id].owner)
        )
        if placed:
            assert held + placed <= cap, (subject, held, placed, cap)
    assert schedule(snap) == plan  # and the same snapshot gives the same plan


@settings(max_examples=150, deadline=None)
@given(shared_clusters())
def test_every_users_oldest_job_is_in_the_first_turn(snap: Snapshot) -> None:
    order = fair_order(snap)
    for priority in {j.priority for j in order}:
        level = [j for j in order if j.priority == priority]
        users = {j.owner for j in level}
        first = {}
        for j in sorted(level, key=lambda j: j.seq):
            first.setdefault(j.owner, j.id)
        head = [j.id for j in level[: len(users)]]
        assert set(first.values()) == set(head)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.lists(st.integers(0, 3), min_size=4, max_size=4))
def test_no_user_starves_over_repeated_passes(gpus: int, users: int, heavy: list[int]) -> None:
    """Every pass, the GPUs free up and each placed job adds to its user's use; every user with
    waiting 1-GPU jobs gets one within ceil(users / GPUs) passes, however many jobs others have."""
    owners = [f"u{i}" for i in range(users)]
    queue = [
        job(f"{o}-{k}", seq=i * 100 + k, gpus=1, owner=o)
        for i, o in enumerate(owners)
        for k in range(1 + 5 * heavy[i % 4])
    ]
    usage = dict.fromkeys(owners, 0.0)
    waited = dict.fromkeys(owners, 0)
    for _ in range(3 * math.ceil(users / gpus) + 2):
        if not queue:
            break
        plan = schedule(snapshot([gpu_worker("w", gpus)], queue, usage=usage))
        placed = {a.job_id for a in plan.assignments}
        got = {j.owner for j in queue if j.id in placed}
        for o in {j.owner for j in queue}:
            waited[o] = 0 if o in got else waited[o] + 1
            assert waited[o] < math.ceil(users / gpus) + 1, (o, waited)
        for j in queue:
            if j.id in placed:
                usage[j.owner] += 60.0
        queue = [j for j in queue if j.id not in placed]
