"""Scheduler benchmark: one full pass over a big queue, and one new job into a busy cluster.

    python benchmarks/bench_scheduler.py            # 10,000 jobs x 1,000 workers, growth 1k/10k
    python benchmarks/bench_scheduler.py --big      # growth up to 100,000 jobs too
    python benchmarks/bench_scheduler.py --quick    # CI smoke size (seconds)
    python benchmarks/bench_scheduler.py --against /tmp/before/scheduler   # before vs after

Workers have 0-8 GPUs of several kinds (some simulated, a few cordoned or draining), about half
of their devices busy; jobs mix CPU and 1/2/4/8-GPU jobs, kinds, memory floors, priorities, CPU
counts, selectors, fallbacks and two-node gangs, some waiting long enough to reserve. Timings are
the median of several rounds after a warm-up, each pass run as the ControlPlane runs its own: with
one ``SchedulerCache`` kept across passes (warm, as it is in use: the ControlPlane reuses each
worker's capabilities object) and the cyclic GC paused (``gc_paused()``). The line before the last
gives the same passes with the collector running, as ``schedule`` alone runs them (in a kernel).

Baseline: the interim first-fit scheduler this one replaced (one scan of every worker per job, no
explanations worth the name), run in the same process, interleaved round by round with the new one;
the ratio printed is the median of per-round ratios. One new job is measured three ways: into the
same cluster as the last pass (the standing cluster reused whole), after a job started or ended on
one worker (the standing cluster patched: what the ControlPlane's passes see) and without a cache
(everything built again). The last line is the one-new-job figure.

``--against DIR``: DIR is a copy of ``gpulayer_kernel/scheduler`` from before a change (``cp -r``
it first). The full pass then also runs through that copy, in the same process, alternating
pass by pass with this one, each with its own warm cache; the last line gives both CPU medians
and the median of per-round ratios, and says whether the two gave the same plan.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulayer_kernel.contracts import (
    CommandWorkload,
    Job,
    JobSpec,
    JobState,
    NodePlacement,
    Placement,
    PlacementReport,
    Reason,
    ReasonCount,
    Resources,
    WorkerInfo,
    WorkerState,
)
from gpulayer_kernel.controlplane.scheduling import SchedulingLoop
from gpulayer_kernel.scheduler import (
    Assignment,
    JobRequest,
    Plan,
    RunningJob,
    SchedulerCache,
    Snapshot,
    WorkerView,
    gc_paused,
    schedule,
)
from gpulayer_kernel.scheduler.testing import (
    GpuVendor,
    gpu_worker,
    job,
    running,
    snapshot,
)
from gpulayer_kernel.scheduler.views import Views
from gpulayer_kernel.testing import FakeClock

KINDS = [("h100", 80), ("a100", 80), ("a100", 40), ("l4", 24), ("a10g", 24)]
NOW = 100_000.0


def make_workers(n: int, busy: float, rng: random.Random) -> list[WorkerView]:
    workers = []
    for i in range(n):
        gpus = rng.choice([0, 1, 2, 4, 8, 8, 8])
        kind, memory = rng.choice(KINDS)
        vendor: GpuVendor = "sim" if rng.random() < 0.05 else "nvidia"
        state = WorkerState.READY
        roll = rng.random()
        if roll < 0.03:
            state = WorkerState.CORDONED
        elif roll < 0.05:
            state = WorkerState.DRAINING
        run = []
        taken = [d for d in range(gpus) if rng.random() < busy]
        for d in taken:
            ends = NOW + rng.choice([60.0, 600.0, 3600.0]) if rng.random() < 0.7 else None
            run.append(running(f"r{i}-{d}", [d], cpus=1.0, ends_by=ends))
        workers.append(
            gpu_worker(
                f"w{i:04d}",
                gpus,
                kind,
                memory_gib=memory,
                vendor=vendor,
                cpus=rng.choice([16, 32, 64]),
                state=state,
                labels={"zone": rng.choice("abc")},
                running=run,
            )
        )
    return workers


def make_jobs(n: int, rng: random.Random, start: int = 0) -> list[JobRequest]:
    jobs = []
    for k in range(start, start + n):
        gpus = rng.choice([0, 1, 1, 2, 4, 8])
        nodes = 2 if gpus == 8 and rng.random() < 0.2 else 1
        kind = rng.choice([None, None, "h100", "a100", ["h100", "a100"], "l4", "a100-80gb"])
        jobs.append(
            job(
                f"{k:08x}-job",
                seq=k,
                gpus=gpus,
                nodes=nodes,
                kind=kind if gpus else None,
                memory_gib=40 if gpus and rng.random() < 0.1 else None,
                cpus=rng.choice([None, None, 2.0, 4.0]),
                fallback=gpus == 1 and rng.random() < 0.1,
                selector={"zone": "a"} if rng.random() < 0.05 else None,
                priority=rng.choice([-1, 0, 0, 0, 1, 5]),
                submitted_at=NOW - rng.choice([1.0, 30.0, 600.0]),
                timeout=rng.choice([None, 60.0, 3600.0]),
            )
        )
    return jobs


def interim_first_fit(snap: Snapshot) -> Plan:
    """The scheduler this one replaced (kept here only as the benchmark's baseline)."""
    busy = {w.id: {d for r in w.running for d in r.devices} for w in snap.workers}
    assignments = []
    pending = {}
    for jr in sorted(snap.pending, key=lambda j: (-j.priority, j.seq)):
        need = jr.resources.gpus
        placed = None
        for w in sorted(snap.workers, key=lambda w: w.id):
            if w.state not in (WorkerState.READY, WorkerState.BUSY):
                continue
            devices = [d.index for d in w.capabilities.devices if d.vendor != "cpu"]
            free = [d for d in devices if d not in busy[w.id]]
            if need == 0:
                placed = NodePlacement(worker_id=w.id, worker_name=w.name)
                break
            if len(free) >= need:
                chosen = free[:need]
                busy[w.id].update(chosen)
                placed = NodePlacement(worker_id=w.id, worker_name=w.name, devices=chosen)
                break
        if placed is not None:
            assignments.append(
                Assignment(jr.id, Placement(nodes=[placed], explanation="first fit"))
            )
        else:
            n = len(snap.workers)
            pending[jr.id] = PlacementReport(
                job_id=jr.id,
                workers_total=n,
                exhausted=[
                    ReasonCount(code=Reason.GPUS_BUSY, workers=n, detail="", waiting_helps=True)
                ],
            )
    return Plan(tuple(assignments), pending)


class Churn:
    """Snapshots of ``workers`` where, from one to the next, a job ends or starts on one worker (a
    new ``WorkerView`` of it, the rest the same objects), as between the ControlPlane's passes."""

    def __init__(self, workers: list[WorkerView], jobs: list[JobRequest]) -> None:
        self.workers = list(workers)
        self.jobs = jobs
        self.turn = 0
        self.parked: dict[int, RunningJob] = {}

    def next(self) -> Snapshot:
        self.turn += 1
        i = (self.turn * 7919) % len(self.workers)
        w = self.workers[i]
        if i in self.parked:
            view = replace(w, running=(*w.running, self.parked.pop(i)))
        elif w.running:
            self.parked[i] = w.running[-1]
            view = replace(w, running=w.running[:-1])
        else:
            view = replace(w)
        self.workers[i] = view
        return snapshot(self.workers, self.jobs, now=NOW)


class _Records:
    """The job table and worker registry as the scheduling loop reads them for a snapshot."""

    def __init__(self, jobs: list[Job], workers: list[WorkerInfo]) -> None:
        self.jobs = jobs
        self.workers = workers

    def active(self) -> list[Job]:
        return list(self.jobs)

    def live(self) -> list[WorkerInfo]:
        return list(self.workers)

    def suspected(self, worker_id: str) -> bool:
        return False

    def quotas(self) -> list[object]:
        return []


def control_plane_loop(views: list[WorkerView]) -> tuple[SchedulingLoop, Job]:
    """A SchedulingLoop over records that say what ``views`` say, with one job queued."""
    infos, jobs = [], []
    for w in views:
        infos.append(
            WorkerInfo(
                id=w.id,
                name=w.name,
                state=w.state,
                labels=dict(w.labels),
                capabilities=w.capabilities,
                registered_at=0.0,
                last_heartbeat=NOW,
            )
        )
        for r in w.running:
            spec = JobSpec(
                workload=CommandWorkload(argv=["true"]),
                resources=Resources(gpus=len(r.devices), cpus=r.cpus or None),
            )
            place = Placement(
                nodes=[NodePlacement(worker_id=w.id, worker_name=w.name, devices=list(r.devices))],
                explanation="",
            )
            jobs.append(
                Job(
                    id=r.id,
                    seq=len(jobs),
                    spec=spec,
                    state=JobState.RUNNING,
                    placement=place,
                    submitted_at=NOW - 10,
                    placed_at=NOW - 9,
                    started_at=NOW - 9,
                )
            )
    queued = Job(id="new-job", seq=len(jobs), spec=JobSpec(
        workload=CommandWorkload(argv=["true"]), resources=Resources(gpus=2, gpu_kind=["a100"])
    ), submitted_at=NOW)  # fmt: skip
    records = _Records([*jobs, queued], infos)
    loop = SchedulingLoop(
        None,  # type: ignore[arg-type]  (a snapshot reads neither the store, logs nor dispatch)
        records,  # type: ignore[arg-type]
        records,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        clock=FakeClock(NOW),
        secrets=None,  # type: ignore[arg-type]
        users=records,  # type: ignore[arg-type]
        usage=None,  # type: ignore[arg-type]
    )
    return loop, queued


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one call (CPU time shows through a busy shared machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1000.0, (time.process_time() - c0) * 1000.0


def median_ms(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    timed(fn)  # warm-up
    runs = [timed(fn) for _ in range(rounds)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def paired(
    new: Callable[[], object], old: Callable[[], object], rounds: int
) -> tuple[float, float, float, float]:
    """Interleaved rounds: wall medians of each, the median of per-round ratios old/new, and the
    new one's CPU median."""
    timed(new)
    timed(old)
    news, olds, ratios, cpus = [], [], [], []
    for _ in range(rounds):
        a, cpu = timed(new)
        b, _ = timed(old)
        news.append(a)
        olds.append(b)
        ratios.append(b / a)
        cpus.append(cpu)
    return (
        statistics.median(news),
        statistics.median(olds),
        statistics.median(ratios),
        statistics.median(cpus),
    )


def paired_cpu(
    new: Callable[[], object], old: Callable[[], object], rounds: int
) -> tuple[float, float, float]:
    """Interleaved rounds on the CPU clock: each one's median and the median per-round ratio
    old/new (CPU time: what a shared machine's load bends least)."""
    timed(new)
    timed(old)
    news, olds, ratios = [], [], []
    for _ in range(rounds):
        _, a = timed(new)
        _, b = timed(old)
        news.append(a)
        olds.append(b)
        ratios.append(b / a)
    return statistics.median(news), statistics.median(olds), statistics.median(ratios)


def load_before(path: Path) -> ModuleType:
    """The scheduler package copied to ``path``, importable beside this one (its relative
    imports of ``..contracts`` and the like resolve to this tree's)."""
    name = "gpulayer_kernel._scheduler_before"
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py", submodule_search_locations=[str(path)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against: no scheduler package at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def same_plan(a: Plan, b: Plan) -> bool:
    """Equal by value (the two packages' dataclasses are different classes)."""

    def value(p: Plan) -> object:
        return (
            [(x.job_id, x.placement) for x in p.assignments],
            dict(p.pending),
            {k: (r.devices, r.since, r.starts_by) for k, r in p.reservations.items()},
        )

    return value(a) == value(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="CI smoke size")
    parser.add_argument("--big", action="store_true", help="also measure 100,000 jobs")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="a copy of gpulayer_kernel/scheduler from before a change: full passes interleaved",
    )
    args = parser.parse_args(argv)
    before = load_before(args.against) if args.against else None
    rng = random.Random(20261129)
    n_workers = 100 if args.quick else 1000
    n_jobs = 1000 if args.quick else 10_000
    rounds = args.rounds or (3 if args.quick else 7)

    cache = SchedulerCache()

    def run(snap: Snapshot) -> Plan:
        """One pass as the ControlPlane's scheduling loop runs it."""
        with gc_paused():
            return schedule(snap, cache)

    def run_collecting(snap: Snapshot) -> Plan:
        """One pass as ``schedule`` alone runs it: the collector is left alone."""
        return schedule(snap, cache)

    workers = make_workers(n_workers, 0.5, rng)
    jobs = make_jobs(n_jobs, rng)
    snap = snapshot(workers, jobs, now=NOW)
    cold, _ = timed(lambda: schedule(snap))  # no cache: a fresh one, as a one-off caller gets
    plan = run(snap)
    full, full_cpu = median_ms(partial(run, snap), rounds)
    print(
        f"full pass: {full:.0f} ms (jobs={n_jobs} workers={n_workers}; cpu {full_cpu:.0f} ms; "
        f"placed={len(plan.assignments)} waiting={len(plan.pending)} "
        f"reservations={len(plan.reservations)}; without a cache {cold:.0f} ms)"
    )

    sizes = [100, 1000] if args.quick else [1000, 10_000] + ([100_000] if args.big else [])
    for size in sizes:
        more = make_jobs(size, random.Random(size))
        s = snapshot(workers, more, now=NOW)
        ms, cpu = median_ms(partial(run, s), rounds if size <= 10_000 else 1)
        print(
            f"growth: {ms:.0f} ms for jobs={size} workers={n_workers} "
            f"(cpu {cpu:.0f} ms, {cpu * 1000 / size:.1f} us/job)"
        )

    small = snapshot(workers, make_jobs(n_jobs // 10, random.Random(7)), now=NOW)
    new_ms, old_ms, ratio, _ = paired(partial(run, small), lambda: interim_first_fit(small), rounds)
    print(
        f"baseline, interim first fit, interleaved: jobs={len(small.pending)} "
        f"workers={n_workers}: this {new_ms:.1f} ms vs first fit {old_ms:.1f} ms "
        f"(median per-round ratio first fit / this: {ratio:.2f})"
    )

    busy_workers = make_workers(n_workers, 0.9, random.Random(11))
    one = snapshot(busy_workers, [job("new-job", seq=1, gpus=2, kind="a100")], now=NOW)
    one_plan = run(one)
    new_ms, old_ms, ratio, cpu = paired(
        partial(run, one), lambda: interim_first_fit(one), max(rounds, 21)
    )
    outcome = "placed" if one_plan.assignments else "waiting"
    print(
        f"baseline, interim first fit, one new job, interleaved: {old_ms:.2f} ms "
        f"(median per-round ratio first fit / this: {ratio:.2f})"
    )
    # As the ControlPlane's passes go: between two of them a job started or ended somewhere, so
    # one worker arrives as a new view (its class unchanged) and the standing cluster is patched.
    churn = Churn(busy_workers, [job("new-job", seq=1, gpus=2, kind="a100")])
    patched_ms, _, patched_ratio, _ = paired(
        lambda: run(churn.next()), lambda: interim_first_fit(churn.next()), max(rounds, 21)
    )
    print(
        f"one new job, a job started or ended on one worker since the last pass: "
        f"{patched_ms:.2f} ms (median per-round ratio first fit / this: {patched_ratio:.2f})"
    )
    cold_one, _ = median_ms(lambda: schedule(one), max(rounds, 21))
    print(f"one new job without a cache (a fresh one each pass): {cold_one:.2f} ms")
    # The same job through the control plane's pass: its snapshot from the job table and the
    # worker registry (views.py keeps the RunningJobs and WorkerViews of unchanged records),
    # then schedule; against the snapshot built afresh each pass.
    loop, _queued = control_plane_loop(busy_workers)

    def cp_pass(fresh: bool) -> Plan:
        if fresh:
            loop.views = Views()
        return run(loop.snapshot())

    kept_ms, fresh_ms, cp_ratio, _ = paired(
        partial(cp_pass, False), partial(cp_pass, True), max(rounds, 21)
    )
    print(
        f"one new job through the control plane's pass (snapshot + schedule): {kept_ms:.2f} ms "
        f"with the views kept vs {fresh_ms:.2f} ms built afresh (median per-round ratio "
        f"{cp_ratio:.2f})"
    )
    # The collector's share, interleaved with the paused runs: what gc_paused() buys.
    full_gc, full_paused, full_ratio, _ = paired(
        partial(run_collecting, snap), partial(run, snap), rounds
    )
    one_gc, one_paused, one_ratio, _ = paired(
        partial(run_collecting, one), partial(run, one), max(rounds, 21)
    )
    print(
        f"collector running, interleaved with paused: full pass {full_gc:.0f} ms vs "
        f"{full_paused:.0f} ms (median per-round ratio {1 / full_ratio:.2f}), one new job "
        f"{one_gc:.2f} ms vs {one_paused:.2f} ms (ratio {1 / one_ratio:.2f})"
    )
    print(
        f"one new job: {new_ms:.2f} ms (workers={n_workers}, 90% of GPUs busy, {outcome}; "
        f"cpu {cpu:.2f} ms)"
    )
    if before is not None:
        old_cache = before.SchedulerCache()

        def run_before(s: Snapshot) -> Plan:
            with gc_paused():
                plan: Plan = before.schedule(s, old_cache)
                return plan

        same = same_plan(run(snap), run_before(snap))
        new_cpu, old_cpu, ratio = paired_cpu(
            partial(run, snap), partial(run_before, snap), max(rounds, 9)
        )
        print(
            f"full pass against {args.against}, interleaved: cpu {new_cpu:.0f} ms vs "
            f"{old_cpu:.0f} ms before (median per-round ratio before / this: {ratio:.2f}; "
            f"{'the same plan' if same else 'PLANS DIFFER'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
