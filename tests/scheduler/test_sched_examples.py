"""Example tests: exact placements, reason codes, counts and sentences."""

from __future__ import annotations

from gpulayer_kernel.contracts import Reason, ReasonCount, WorkerState
from gpulayer_kernel.scheduler import Plan, schedule
from gpulayer_kernel.scheduler.explain import render
from gpulayer_kernel.scheduler.testing import (
    cpu_worker,
    gpu_worker,
    job,
    running,
    snapshot,
)

JOB = "3f2a9c1d-5b7e-4e0a-9d1c-2b3a4c5d6e7f"


def busy(worker: str, *devices: int) -> list:  # type: ignore[type-arg]
    return [running(f"{worker}-r{d}", [d]) for d in devices]


def placed(plan: Plan) -> dict[str, list[tuple[str, list[int]]]]:
    return {
        a.job_id: [(n.worker_id, n.devices) for n in a.placement.nodes] for a in plan.assignments
    }


def codes(plan: Plan, job_id: str) -> dict[Reason, int]:
    report = plan.pending[job_id]
    return {rc.code: rc.workers for rc in [*report.filtered, *report.exhausted]}


# -- the sentence ------------------------------------------------------------------------------


def test_no_workers_sentence_says_how_to_start_one() -> None:
    plan = schedule(snapshot([], [job(JOB, 1, gpus=1)]))
    report = plan.pending[JOB]
    assert report.workers_total == 0
    assert report.sentence == (
        "0/0 workers can run job 3f2a9c1d: no workers have joined yet; start one with "
        "`gpulayer worker`; position 1 in the queue"
    )
    assert report.waiting_helps


def test_the_documented_sentence_shape() -> None:
    workers = [gpu_worker(f"w{i}", 4, "h100", running=busy(f"w{i}", 0, 1, 2)) for i in (1, 2, 3)]
    workers.append(gpu_worker("w4", 2, "l4"))
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=2, kind="h100")]))
    report = plan.pending[JOB]
    assert report.sentence == (
        "0/4 workers can run job 3f2a9c1d: 3 have too few free GPUs (need 2; waiting helps), "
        "1 has no GPU of kind h100 (waiting won't help); position 1 in the queue"
    )
    assert report.filtered == [
        ReasonCount(
            code=Reason.GPU_KIND, workers=1, detail="no GPU of kind h100", waiting_helps=False
        )
    ]
    assert report.exhausted == [
        ReasonCount(
            code=Reason.GPUS_BUSY,
            workers=3,
            detail="too few free GPUs (need 2)",
            waiting_helps=True,
        )
    ]
    assert report.workers_feasible == 0
    assert report.candidates == ["w1", "w2", "w3"]
    assert render(report) == report.sentence


def test_filtered_only_says_waiting_wont_help() -> None:
    plan = schedule(snapshot([cpu_worker("c1"), cpu_worker("c2")], [job(JOB, 1, gpus=1)]))
    report = plan.pending[JOB]
    assert codes(plan, JOB) == {Reason.NO_GPUS: 2}
    assert not report.waiting_helps
    assert report.sentence == (
        "0/2 workers can run job 3f2a9c1d: 2 have no GPUs (the job did not ask for "
        'fallback=["cpu"]; waiting won\'t help); position 1 in the queue'
    )


def test_positions_follow_priority_then_submission() -> None:
    workers = [cpu_worker("c1")]
    jobs = [
        job("late-hi", 5, gpus=1, priority=10),
        job("early", 1, gpus=1),
        job("later", 2, gpus=1),
    ]
    plan = schedule(snapshot(workers, jobs))
    assert [plan.pending[j].position for j in ("late-hi", "early", "later")] == [1, 2, 3]
    assert plan.pending["later"].sentence.endswith("; position 3 in the queue")


# -- placement policy --------------------------------------------------------------------------


def test_tightest_fit_and_its_explanation() -> None:
    workers = [
        gpu_worker("big", 8, "h100"),
        gpu_worker("w1", 4, "h100", running=busy("w1", 2, 3)),
    ]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=2)]))
    assert placed(plan) == {JOB: [("w1", [0, 1])]}
    assert plan.assignments[0].placement.explanation == (
        "placed on w1 devices [0,1]: tightest fit, 0 GPUs left free"
    )


def test_devices_prefer_the_shortest_contiguous_run() -> None:
    # free: 0 | 2 3 | 5 6 7   (1 and 4 busy)
    w = gpu_worker("w1", 8, "h100", running=busy("w1", 1, 4))
    plan = schedule(snapshot([w], [job("two", 1, gpus=2), job("three", 2, gpus=3)]))
    assert placed(plan) == {"two": [("w1", [2, 3])], "three": [("w1", [5, 6, 7])]}


def test_devices_without_a_run_take_the_lowest() -> None:
    w = gpu_worker("w1", 4, "h100", running=busy("w1", 1, 3))
    plan = schedule(snapshot([w], [job("two", 1, gpus=2)]))
    assert placed(plan) == {"two": [("w1", [0, 2])]}


def test_gang_is_all_or_nothing() -> None:
    workers = [gpu_worker(f"w{i}", 4, "a100", running=busy(f"w{i}", 0, 1)) for i in (1, 2)]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=4)]))
    assert plan.assignments == ()
    assert codes(plan, JOB) == {Reason.GPUS_BUSY: 2}


def test_multi_node_gang_takes_distinct_workers_with_ranks() -> None:
    workers = [
        gpu_worker("w1", 4, "a100", running=busy("w1", 2, 3)),
        gpu_worker("w2", 4, "a100"),
        gpu_worker("w3", 2, "a100"),
    ]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=2, nodes=2)]))
    (a,) = plan.assignments
    assert [(n.worker_id, n.devices, n.node_rank) for n in a.placement.nodes] == [
        ("w1", [0, 1], 0),
        ("w3", [0, 1], 1),
    ]
    assert a.placement.explanation == (
        "placed on w1 devices [0,1] (node 0) and w3 devices [0,1] (node 1): "
        "tightest fit, 0 GPUs left free on each"
    )


def test_multi_node_reports_too_few_and_not_enough_nodes() -> None:
    workers = [
        gpu_worker("w1", 4, "a100"),
        gpu_worker("w2", 4, "a100", running=busy("w2", 0, 1, 2)),
        gpu_worker("w3", 4, "l4"),
    ]
    plan = schedule(
        snapshot(
            workers,
            [
                job("three-nodes", 1, gpus=2, nodes=3, kind="a100"),
                job("two-nodes", 2, gpus=2, nodes=2, kind="a100"),
            ],
        )
    )
    assert codes(plan, "three-nodes") == {Reason.TOO_FEW_NODES: 2, Reason.GPU_KIND: 1}
    assert plan.pending["three-nodes"].sentence.startswith(
        # Too few suitable workers: none of them "can run" it (issue 12, item 16).
        "0/3 workers can run job three-no, which needs 3 at once: "
        "2 are suitable but too few (need 3 workers; waiting won't help), "
        "1 has no GPU of kind a100 (waiting won't help)"
    )
    assert codes(plan, "two-nodes") == {
        Reason.NOT_ENOUGH_NODES: 1,
        Reason.GPUS_BUSY: 1,
        Reason.GPU_KIND: 1,
    }
    assert plan.pending["two-nodes"].workers_feasible == 1


def test_priority_then_submission_order_wins_the_last_gpu() -> None:
    w = gpu_worker("w1", 1, "h100")
    plan = schedule(snapshot([w], [job("first", 1, gpus=1), job("urgent", 2, gpus=1, priority=5)]))
    assert placed(plan) == {"urgent": [("w1", [0])]}
    plan = schedule(snapshot([w], [job("second", 2, gpus=1), job("first", 1, gpus=1)]))
    assert placed(plan) == {"first": [("w1", [0])]}


def test_kind_preferences_are_tried_in_order() -> None:
    workers = [gpu_worker("a", 2, "a100"), gpu_worker("h", 2, "h100")]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=1, kind=["h100", "a100"])]))
    assert placed(plan) == {JOB: [("h", [0])]}
    assert plan.assignments[0].placement.explanation == (
        "placed on h devices [0]: first-choice kind h100, tightest fit, 1 GPU left free"
    )
    workers = [gpu_worker("a", 2, "a100"), gpu_worker("h", 2, "h100", running=busy("h", 0, 1))]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=1, kind=["h100", "a100"])]))
    assert placed(plan) == {JOB: [("a", [0])]}
    assert plan.assignments[0].placement.explanation == (
        "placed on a devices [0]: kind a100 (choice 2; no room on h100), tightest fit, "
        "1 GPU left free"
    )


def test_kind_with_memory_suffix_and_memory_floor() -> None:
    workers = [
        gpu_worker("a40g", 4, "a100", memory_gib=40),
        gpu_worker("l4", 4, "l4", memory_gib=24),
    ]
    plan = schedule(
        snapshot(
            workers,
            [job("suffix", 1, gpus=1, kind="a100-80gb"), job("floor", 2, gpus=1, memory_gib=48)],
        )
    )
    assert codes(plan, "suffix") == {Reason.GPU_MEMORY: 1, Reason.GPU_KIND: 1}
    assert plan.pending["suffix"].filtered[1].detail == "no GPU with 80 GiB or more"
    assert codes(plan, "floor") == {Reason.GPU_MEMORY: 2}
    assert plan.pending["floor"].filtered[0].detail == "no GPU with 48 GiB or more"
    mixed = schedule(snapshot(workers[:1], [job("mixed", 1, gpus=1, kind=["a100-80gb", "l4"])]))
    assert codes(mixed, "mixed") == {Reason.GPU_MEMORY: 1}
    assert mixed.pending["mixed"].filtered[0].detail == "no GPU with 80 GiB or more"


def test_too_few_gpus_in_all() -> None:
    plan = schedule(snapshot([gpu_worker("w1", 8)], [job(JOB, 1, gpus=16)]))
    assert codes(plan, JOB) == {Reason.TOO_FEW_GPUS_TOTAL: 1}
    assert plan.pending[JOB].filtered[0].detail == "too few suitable GPUs in all (need 16)"


def test_real_gpus_before_simulated_and_sim_is_marked() -> None:
    workers = [gpu_worker("sim1", 2, "a100", vendor="sim"), gpu_worker("real", 4, "a100")]
    plan = schedule(snapshot(workers, [job("a", 1, gpus=2)]))
    assert placed(plan) == {"a": [("real", [0, 1])]}
    plan = schedule(snapshot(workers, [job("s", 1, gpus=2, kind="sim")]))
    (a,) = plan.assignments
    assert a.placement.nodes[0].simulated
    assert a.placement.explanation == (
        "placed on sim1 simulated devices [0,1]: first-choice kind sim, tightest fit, "
        "0 GPUs left free"
    )


# -- CPU jobs and fallback ---------------------------------------------------------------------


def test_fallback_only_when_asked_and_only_when_no_gpu_is_free() -> None:
    workers = [gpu_worker("g", 1, "h100", running=busy("g", 0)), cpu_worker("c")]
    plan = schedule(snapshot(workers, [job("fb", 1, gpus=1, fallback=True), job("no", 2, gpus=1)]))
    (a,) = plan.assignments
    assert a.job_id == "fb"
    assert [(n.worker_id, n.devices, n.cpu_fallback) for n in a.placement.nodes] == [
        ("c", [], True)
    ]
    assert a.placement.explanation == (
        'placed on c: no GPU could take it now and it asked for fallback=["cpu"], so it runs on CPU'
    )
    assert codes(plan, "no") == {Reason.GPUS_BUSY: 1, Reason.NO_GPUS: 1}
    free = [gpu_worker("g", 1, "h100"), cpu_worker("c")]
    plan = schedule(snapshot(free, [job("fb", 1, gpus=1, fallback=True)]))
    assert not plan.assignments[0].placement.nodes[0].cpu_fallback


def test_cpu_jobs_prefer_cpu_only_workers_and_count_cpus() -> None:
    workers = [gpu_worker("g", 2, "h100", cpus=16), cpu_worker("c", cpus=4)]
    jobs = [job("a", 1, cpus=3), job("b", 2, cpus=3), job("c", 3), job("huge", 4, cpus=64)]
    plan = schedule(snapshot(workers, jobs))
    assert placed(plan) == {"a": [("c", [])], "b": [("g", [])], "c": [("c", [])]}
    explanations = {a.job_id: a.placement.explanation for a in plan.assignments}
    assert explanations["a"] == "placed on c: CPU job; CPU-only workers first"
    assert explanations["b"] == "placed on g: CPU job; no CPU-only worker could take it"
    assert codes(plan, "huge") == {Reason.CPUS_TOTAL: 2}


def test_cpus_busy_is_exhausted() -> None:
    workers = [cpu_worker("c", cpus=4, running=[running("r", cpus=3)])]
    plan = schedule(snapshot(workers, [job(JOB, 1, cpus=2)]))
    assert codes(plan, JOB) == {Reason.CPUS_BUSY: 1}
    assert plan.pending[JOB].exhausted[0].detail == "too few free CPUs (need 2)"


# -- worker states, labels, names, support matrix ----------------------------------------------


def test_worker_states() -> None:
    workers = [
        gpu_worker("ready", 1, running=busy("ready", 0)),
        gpu_worker("busy", 1, state=WorkerState.BUSY),
        gpu_worker("cordoned", 1, state=WorkerState.CORDONED),
        gpu_worker("draining", 1, state=WorkerState.DRAINING),
        gpu_worker("lost", 1, state=WorkerState.LOST),
    ]
    plan = schedule(snapshot(workers, [job("a", 1, gpus=1), job("b", 2, gpus=1)]))
    assert placed(plan) == {"a": [("busy", [0])]}
    assert codes(plan, "b") == {
        Reason.GPUS_BUSY: 2,
        Reason.CORDONED: 1,
        Reason.DRAINING: 1,
        Reason.WORKER_NOT_READY: 1,
    }
    assert plan.pending["b"].sentence == (
        "0/5 workers can run job b: 2 have too few free GPUs (need 1; waiting helps), "
        "1 is not ready (lost or offline; waiting won't help), 1 is cordoned (waiting won't help), "
        "1 is draining (waiting won't help); position 1 in the queue"
    )


def test_selector_and_worker_name() -> None:
    workers = [
        gpu_worker("w1", 2, labels={"pool": "a"}),
        gpu_worker("w2", 2, labels={"pool": "b"}),
        gpu_worker("w3", 2, labels={"pool": "a"}, state=WorkerState.CORDONED),
    ]
    plan = schedule(
        snapshot(
            workers,
            [
                job("sel", 1, gpus=1, selector={"pool": "b"}),
                job("named", 2, gpus=2, worker="w1"),
                job("nowhere", 3, gpus=1, selector={"pool": "z"}),
                job("ghost", 4, gpus=1, worker="w9"),
            ],
        )
    )
    assert placed(plan) == {"sel": [("w2", [0])], "named": [("w1", [0, 1])]}
    assert codes(plan, "nowhere") == {Reason.SELECTOR_MISMATCH: 2, Reason.CORDONED: 1}
    assert plan.pending["nowhere"].filtered[1].detail == "labels that don't match pool=z"
    assert codes(plan, "ghost") == {Reason.NAME_MISMATCH: 2, Reason.CORDONED: 1}
    assert "2 are not named w9 (waiting won't help)" in plan.pending["ghost"].sentence


def test_apple_mps_runs_single_device_jobs_only() -> None:
    macs = [gpu_worker(f"mac{i}", 1, "m2", vendor="apple", memory_gib=32) for i in (1, 2)]
    plan = schedule(
        snapshot(
            macs,
            [
                job("one", 1, gpus=1),
                job("two", 2, gpus=2),
                job("nodes", 3, gpus=1, nodes=2),
            ],
        )
    )
    assert placed(plan) == {"one": [("mac1", [0])]}
    assert codes(plan, "two") == {Reason.MPS_DISTRIBUTED: 2}
    assert plan.pending["two"].filtered[0].detail == (
        "only Apple MPS, which runs single-device jobs (need 2)"
    )
    assert codes(plan, "nodes") == {Reason.MPS_DISTRIBUTED: 2}
    no_torch = gpu_worker("mac3", 1, "m2", vendor="apple", mps=False)
    plan = schedule(snapshot([no_torch], [job("one", 1, gpus=1)]))
    assert codes(plan, "one") == {Reason.UNSUPPORTED_VENDOR: 1}
    assert plan.pending["one"].filtered[0].detail == (
        "no usable GPU of that kind (Apple GPU without torch MPS)"
    )


def test_amd_needs_torch_rocm() -> None:
    plain = gpu_worker("amd", 8, "mi300x", vendor="amd")
    rocm = gpu_worker("rocm", 8, "mi300x", vendor="amd", rocm=True)
    plan = schedule(snapshot([plain], [job(JOB, 1, gpus=1)]))
    assert codes(plan, JOB) == {Reason.UNSUPPORTED_VENDOR: 1}
    assert "AMD GPU without a working torch ROCm" in plan.pending[JOB].sentence
    plan = schedule(snapshot([plain, rocm], [job(JOB, 1, gpus=1, kind="mi300x")]))
    assert placed(plan) == {JOB: [("rocm", [0])]}


# -- reservations and backfill -----------------------------------------------------------------


def reservation_cluster(ends_by: float | None = 1500.0) -> list:  # type: ignore[type-arg]
    # 4 GPUs: devices 0-1 busy until ends_by, 2-3 free.
    return [gpu_worker("w1", 4, "a100", running=[running("long", [0, 1], ends_by=ends_by)])]


def test_a_waiting_gang_reserves_and_blocks_later_small_jobs() -> None:
    jobs = [job("gang", 1, gpus=4, submitted_at=0.0), job("small", 2, gpus=1)]
    plan = schedule(snapshot(reservation_cluster(), jobs, now=1000.0, reserve_after=60.0))
    res = plan.reservations["gang"]
    assert dict(res.devices) == {"w1": (0, 1, 2, 3)}
    assert (res.since, res.starts_by) == (1000.0, 1500.0)
    assert plan.assignments == ()
    small = plan.pending["small"]
    assert codes(plan, "small") == {Reason.RESERVED: 1}
    assert small.reserved_by == "gang"
    assert small.exhausted[0].detail == "GPUs reserved for job gang"
    assert plan.pending["gang"].reservation == ["w1"]
    assert "; GPUs are reserved for it on w1" in plan.pending["gang"].sentence


def test_no_reservation_before_reserve_after() -> None:
    jobs = [job("gang", 1, gpus=4, submitted_at=990.0), job("small", 2, gpus=1)]
    plan = schedule(snapshot(reservation_cluster(), jobs, now=1000.0, reserve_after=60.0))
    assert plan.reservations == {}
    assert placed(plan) == {"small": [("w1", [2])]}


def test_backfill_only_when_the_job_ends_before_the_reservation_starts() -> None:
    jobs = [
        job("gang", 1, gpus=4, submitted_at=0.0),
        job("short", 2, gpus=1, timeout=300.0),  # ends at 1300 <= 1500
        job("long", 3, gpus=1, timeout=900.0),  # ends at 1900 > 1500
    ]
    plan = schedule(snapshot(reservation_cluster(), jobs, now=1000.0))
    assert placed(plan) == {"short": [("w1", [2])]}
    assert plan.assignments[0].placement.explanation == (
        "placed on w1 devices [2]: backfilled onto GPUs reserved for job gang "
        "(it ends before they are needed), tightest fit, 1 GPU left free"
    )
    assert codes(plan, "long") == {Reason.RESERVED: 1}


def test_unknown_end_means_no_backfill() -> None:
    jobs = [job("gang", 1, gpus=4, submitted_at=0.0), job("short", 2, gpus=1, timeout=10.0)]
    plan = schedule(snapshot(reservation_cluster(ends_by=None), jobs, now=1000.0))
    assert plan.reservations["gang"].starts_by is None
    assert plan.assignments == ()


def test_jobs_ahead_of_the_gang_may_use_its_devices() -> None:
    jobs = [job("gang", 2, gpus=4, submitted_at=0.0), job("urgent", 3, gpus=2, priority=9)]
    plan = schedule(snapshot(reservation_cluster(), jobs, now=1000.0))
    assert placed(plan) == {"urgent": [("w1", [2, 3])]}


def test_reservation_is_kept_between_passes_and_used_when_free() -> None:
    workers = [
        gpu_worker("w1", 2, "a100", running=[running("x", [0], ends_by=1500.0)]),
        gpu_worker("w2", 2, "a100", running=[running("y", [0], ends_by=1200.0)]),
    ]
    first = schedule(snapshot(workers, [job("gang", 1, gpus=2, submitted_at=0.0)], now=1000.0))
    res = first.reservations["gang"]
    assert dict(res.devices) == {"w2": (0, 1)} and res.starts_by == 1200.0
    # Later w1 frees first, but the reservation stays where it was.
    later = [
        gpu_worker("w1", 2, "a100"),
        gpu_worker("w2", 2, "a100", running=[running("y", [0], ends_by=1200.0)]),
    ]
    second = schedule(
        snapshot(
            later,
            [job("gang", 1, gpus=2, submitted_at=0.0), job("small", 2, gpus=1)],
            now=1100.0,
            reservations=first.reservations,
        )
    )
    # The gang itself comes first and fits on w1 now; its reservation is released.
    assert placed(second)["gang"] == [("w1", [0, 1])]
    assert "gang" not in second.reservations
    still_busy = [
        gpu_worker("w1", 2, "a100", running=[running("x", [0], ends_by=1500.0)]),
        gpu_worker("w2", 2, "a100", running=[running("y", [0], ends_by=1200.0)]),
    ]
    third = schedule(
        snapshot(
            still_busy,
            [job("gang", 1, gpus=2, submitted_at=0.0)],
            now=1100.0,
            reservations=first.reservations,
        )
    )
    assert third.reservations["gang"].since == 1000.0
    assert dict(third.reservations["gang"].devices) == {"w2": (0, 1)}
    freed = [gpu_worker("w1", 2, "a100", running=[running("x", [0])]), gpu_worker("w2", 2, "a100")]
    fourth = schedule(
        snapshot(
            freed,
            [job("gang", 1, gpus=2, submitted_at=0.0)],
            now=1300.0,
            reservations=third.reservations,
        )
    )
    assert placed(fourth) == {"gang": [("w2", [0, 1])]}
    assert fourth.assignments[0].placement.explanation == (
        "placed on w2 devices [0,1]: on the GPUs reserved for it, tightest fit, 0 GPUs left free"
    )


def test_max_reservations_caps_how_many_gangs_hold_devices() -> None:
    workers = [gpu_worker(f"w{i}", 2, "a100", running=busy(f"w{i}", 0)) for i in range(4)]
    gangs = [job(f"g{i}", i, gpus=2, submitted_at=0.0) for i in range(4)]
    plan = schedule(snapshot(workers, gangs, now=1000.0, max_reservations=2))
    assert sorted(plan.reservations) == ["g0", "g1"]
    devices = [d for r in plan.reservations.values() for d in r.devices.items()]
    assert len({w for w, _ in devices}) == 2  # two gangs, two different workers


def test_a_class_with_reservations_keeps_searching_correctly() -> None:
    # Regression: a failed search on a class whose only room is behind a reservation must not
    # raise the class's ceiling (it once did, and a later smaller job read past its buckets).
    workers = [
        gpu_worker("w1", 8, "a100", running=busy("w1", 0, 1, 2, 3, 4, 5)),  # 2 free
        gpu_worker("w2", 8, "a100", running=busy("w2", *range(8))),
    ]
    jobs = [
        job("gang", 1, gpus=8, submitted_at=0.0),  # reserves; w1's two free GPUs stay free
        job("four", 2, gpus=4),
        job("one", 3, gpus=1),
    ]
    plan = schedule(snapshot(workers, jobs, now=1000.0))
    assert dict(plan.reservations["gang"].devices) == {"w1": tuple(range(8))}
    assert plan.assignments == ()
    assert codes(plan, "four") == {Reason.GPUS_BUSY: 2}
    assert codes(plan, "one") == {Reason.GPUS_BUSY: 1, Reason.RESERVED: 1}
    assert plan.pending["one"].reserved_by == "gang"
