"""``reconcile``: each rule of what the providers' reports mean, one test each."""

from __future__ import annotations

from typing import Any

from gpulayer_kernel.autoscale import reconcile
from gpulayer_kernel.contracts import Instance, InstanceState, Offer
from gpulayer_kernel.providers import Census, Reported

S = InstanceState
NOW = 1_000.0
OFFER = Offer(provider="p", name="two", gpus=2, gpu_kind="a100", price_per_hour=4.2)


def inst(iid: str, state: InstanceState, **kw: Any) -> Instance:
    fields: dict[str, Any] = {
        "id": iid * 12,
        "provider": "p",
        "offer": OFFER,
        "state": state,
        "worker_name": f"p-{iid}",
        "requested_at": NOW - 100,
        "boot_deadline": NOW + 500,
        **kw,
    }
    return Instance(**fields)


def run(*records: Instance, reported: tuple[Reported, ...] = (), **kw: Any) -> Any:
    census = kw.pop("census", {"p": Census(reported)})
    return reconcile({i.id: i for i in records}, census, now=NOW, **kw)


def test_a_requested_machine_its_provider_reports_is_adopted() -> None:
    r = run(inst("a", S.REQUESTED), reported=(Reported("job-7", "a" * 12, "booting"),))
    [ch] = r.changes
    assert (ch.state, ch.external_id) == (S.BOOTING, "job-7")


def test_a_requested_machine_nobody_launched_failed_unless_its_launch_is_in_flight() -> None:
    r = run(inst("a", S.REQUESTED))
    assert [(c.state, c.boot_failure) for c in r.changes] == [(S.FAILED, False)]
    assert "never launched" in (r.changes[0].reason or "")
    assert run(inst("a", S.REQUESTED), in_flight=frozenset({"a" * 12})).changes == ()


def test_a_preempted_machine_s_worker_is_lost_as_preempted() -> None:
    r = run(
        inst("a", S.JOINED, worker_id="w1"),
        reported=(Reported("job-7", "a" * 12, "preempted", "batch job 7 PREEMPTED"),),
        workers_live={"w1": True},
    )
    assert [c.state for c in r.changes] == [S.PREEMPTED]
    [lost] = r.lose
    assert (lost.worker_id, lost.preempted) == ("w1", True)


def test_a_machine_ended_elsewhere_fails_and_a_drained_one_is_terminated() -> None:
    ended = (Reported("job-7", "a" * 12, "ended", "batch job 7 CANCELLED"),)
    r = run(inst("a", S.JOINED, worker_id="w1"), reported=ended, workers_live={"w1": True})
    assert [c.state for c in r.changes] == [S.FAILED]
    assert "CANCELLED" in (r.changes[0].reason or "") and r.lose[0].worker_id == "w1"
    r = run(inst("a", S.DRAINING, worker_id="w1"), reported=ended)
    assert [c.state for c in r.changes] == [S.TERMINATED] and r.lose == ()


def test_a_boot_past_its_deadline_is_failed_and_ended_at_the_provider() -> None:
    late = inst("a", S.BOOTING, boot_deadline=NOW - 1, external_id="job-7")
    r = run(late, reported=(Reported("job-7", "a" * 12, "running"),))
    assert [(c.state, c.boot_failure) for c in r.changes] == [(S.FAILED, True)]
    assert r.terminate == ("a" * 12,)


def test_a_joined_machine_whose_worker_is_gone_is_ended() -> None:
    r = run(
        inst("a", S.JOINED, worker_id="w1", external_id="job-7"),
        reported=(Reported("job-7", "a" * 12, "running"),),
        workers_live={"w1": False},
    )
    assert [c.state for c in r.changes] == [S.FAILED] and r.terminate == ("a" * 12,)


def test_machines_gpulayer_does_not_know_are_ended_and_ended_ones_ended_again() -> None:
    stray = Reported("job-9", None, "running")
    forgotten = Reported("job-8", "f" * 12, "running")
    still = Reported("job-7", "a" * 12, "running")
    r = run(inst("a", S.TERMINATED), reported=(stray, forgotten, still))
    assert sorted(s.external_id for s in r.strays) == ["job-8", "job-9"]
    assert r.terminate == ("a" * 12,)


def test_an_unlisted_offer_s_machines_are_neither_found_nor_missing() -> None:
    census = {"p": Census((), frozenset({"p/two"}), ("host down",))}
    assert run(inst("a", S.JOINED, worker_id="w1"), census=census).changes == ()
    assert run(inst("a", S.JOINED, worker_id="w1"), census={"p": None}).changes == ()


def test_what_the_provider_bills_is_carried() -> None:
    r = run(inst("a", S.JOINED), reported=(Reported("job-7", "a" * 12, "running", "", 0.42),))
    assert r.charges == {"a" * 12: 0.42}


def test_a_live_machine_without_its_id_learns_it_from_its_provider() -> None:
    """Issue 32, item 2: a leader killed mid-launch never recorded the machine's id; its worker
    joined the new leader before any round adopted it. The id its provider reports is taken, so
    ending the machine reaches it (it was a no-op, and the worker lived on)."""
    for recorded in (None, "box1"):  # nothing, or the host recorded before launching
        joined = inst("a", S.JOINED, worker_id="w1", external_id=recorded)
        r = run(
            joined, reported=(Reported("box1:77", "a" * 12, "running"),), workers_live={"w1": True}
        )
        [ch] = r.changes
        assert (ch.state, ch.external_id) == (None, "box1:77")
    same = inst("a", S.JOINED, worker_id="w1", external_id="box1:77")
    r = run(same, reported=(Reported("box1:77", "a" * 12, "running"),), workers_live={"w1": True})
    assert r.changes == ()
