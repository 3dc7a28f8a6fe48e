"""Autoscaler benchmark: one scaling decision over a big queue, and a cold start on real Slurm.

    python benchmarks/bench_autoscale.py              # 10,000 jobs x 100 offers; Slurm, 5 rounds
    python benchmarks/bench_autoscale.py --quick      # CI smoke size (1,000 x 20; Slurm 1 round)
    python benchmarks/bench_autoscale.py --no-slurm   # the ledger and the decision only

0. What the cost ledger adds to a no-op job through the control plane (an attempt record and
   two ledger rows, written with the job), against the same control plane without it.
1. ``plan_scaling`` over 10,000 waiting jobs (CPU and 1/2/4/8-GPU jobs of several kinds and
   memory floors, two-node gangs, selectors, budgets) and 100 offers from four providers, with
   machines already booting and idle ones to end: the figure is the median of several rounds
   after a warm-up (target: 50 ms). Baseline, interleaved round by round: the same decision made
   naively (every job tried against every offer with the scheduler's checks, no memo of a
   failed shape, every bin scanned), as a first version would; the ratio is the median of the
   per-round ratios.
2. On a real local Slurm 22.05 (two slurmd nodes), a job submitted with no worker running:
   submit -> a Slurm-launched ``gpulayer worker`` joined -> the job finished, through a real
   ``gpulayer serve``; against ``sbatch --wrap`` of the same command watched to its end with
   ``squeue`` every 50 ms, interleaved round by round (the idle worker is ended between rounds,
   so each round starts cold). The last line is the ratio (GPUlayer / sbatch): what GPUlayer's
   worker costs on top of Slurm's own start.
"""

from __future__ import annotations

import argparse
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import describe

from gpulayer_kernel.autoscale import (
    InstanceView,
    PendingJob,
    ProviderView,
    ScalingSnapshot,
    plan_scaling,
)
from gpulayer_kernel.autoscale.fit import offer_capabilities
from gpulayer_kernel.contracts import (
    InstanceState,
    Offer,
    Resources,
)
from gpulayer_kernel.scheduler.feasible import (
    WorkerClass,
    check,
    derive_profile,
    make_shape,
)

KINDS = [("a100", 80), ("a100", 40), ("h100", 80), ("l4", 24)]
NOW = 100_000.0


def offers(n: int, rng: random.Random) -> list[Offer]:
    out = []
    for i in range(n):
        kind, mem = KINDS[i % len(KINDS)]
        gpus = [0, 1, 2, 4, 8][i % 5]
        out.append(
            Offer(
                provider=f"p{i % 4}",
                name=f"o{i}",
                gpus=gpus,
                gpu_kind=kind if gpus else "",
                gpu_memory=mem << 30 if gpus else 0,
                cpus=max(2, gpus * 8),
                labels={"zone": f"z{i % 3}"},
                price_per_hour=round(0.1 + gpus * rng.uniform(1.0, 4.0), 2),
                boot_seconds=rng.choice([20.0, 40.0, 90.0]),
            )
        )
    return out


def jobs(n: int, rng: random.Random) -> tuple[PendingJob, ...]:
    out = []
    for i in range(n):
        gpus = rng.choice([0, 1, 1, 2, 2, 4, 8])
        kind = rng.choice([[], ["a100"], ["h100", "a100"], ["l4"], ["a100-80gb"]]) if gpus else []
        nodes = 2 if gpus and rng.random() < 0.05 else 1
        selector = {"zone": f"z{rng.randrange(3)}"} if rng.random() < 0.1 else {}
        budgets = (f"team-{rng.randrange(5)}",) if rng.random() < 0.3 else ()
        r = Resources(gpus=gpus, gpu_kind=kind, nodes=nodes, selector=selector)
        out.append(PendingJob(f"j{i:05d}", i, rng.choice([0, 0, 0, 5]), r, NOW - 60, 1.0, budgets))
    return tuple(out)


def snapshot(n_jobs: int, n_offers: int, seed: int = 1) -> tuple[ScalingSnapshot, list[Offer]]:
    rng = random.Random(seed)
    offered = offers(n_offers, rng)
    instances = []
    for i in range(min(50, n_offers)):
        o = offered[(i * 7) % len(offered)]
        state = InstanceState.BOOTING if i % 2 else InstanceState.JOINED
        idle = NOW - 400 if state == InstanceState.JOINED and i % 4 == 0 else None
        instances.append(
            InstanceView(f"{i:012x}", o.provider, o, state, NOW - 30, NOW + 600, idle_since=idle)
        )
    providers = {f"p{i}": ProviderView(f"p{i}", 64) for i in range(4)}
    snap = ScalingSnapshot(
        now=NOW,
        pending=jobs(n_jobs, rng),
        providers=providers,
        instances=tuple(instances),
        max_price_per_hour=5_000.0,
        idle_timeout=300,
    )
    return snap, offered


def naive(snap: ScalingSnapshot, offered: list[Offer], budgets: dict[str, float]) -> int:
    """The same decision made the obvious way: each job against each offer, every time."""
    order = sorted(offered, key=lambda o: (o.price_per_hour, o.boot_seconds, o.id))
    classes = [
        WorkerClass(i, derive_profile(offer_capabilities(o), i), None, o.cpus, None, [])
        for i, o in enumerate(order)
    ]
    bins: list[list[int]] = []  # [offer index, free GPUs]
    launched = {p: 0 for p in snap.providers}
    left = dict(budgets)
    hourly = 0.0
    for job in sorted(snap.pending, key=lambda j: (-j.priority, j.seq, j.id)):
        shape = make_shape(job.resources)
        if any(b[1] >= shape.gpus and check(shape, classes[b[0]]).reason is None for b in bins):
            for b in bins:
                if b[1] >= shape.gpus and check(shape, classes[b[0]]).reason is None:
                    b[1] -= shape.gpus
                    break
            continue
        for i, o in enumerate(order):
            if any(o.labels.get(k) != v for k, v in shape.selector):
                continue
            fit = check(shape, classes[i])
            if fit.reason is not None or not (fit.cpu_only or any(fit.masks)):
                continue
            cost = o.unit_price * max(shape.gpus, 1) * job.hours * shape.nodes
            if launched[o.provider] + shape.nodes > snap.providers[o.provider].max_instances:
                continue
            if hourly + o.price_per_hour * shape.nodes > (snap.max_price_per_hour or 1e18):
                continue
            if any(left.get(b, 1e18) < cost for b in job.budgets):
                continue
            for b in job.budgets:
                if b in left:
                    left[b] -= cost
            launched[o.provider] += shape.nodes
            hourly += o.price_per_hour * shape.nodes
            bins.extend([i, o.gpus - shape.gpus] for _ in range(shape.nodes))
            break
    return len(bins)


def bench_decision(n_jobs: int, n_offers: int, rounds: int) -> float:
    snap, offered = snapshot(n_jobs, n_offers)
    budgets = {f"team-{i}": 500.0 for i in range(5)}
    plan = plan_scaling(snap, offered, budgets)  # warm-up
    naive(snap, offered, budgets)
    ours, base, ratios = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        plan = plan_scaling(snap, offered, budgets)
        t1 = time.perf_counter()
        naive(snap, offered, budgets)
        t2 = time.perf_counter()
        ours.append((t1 - t0) * 1000)
        base.append((t2 - t1) * 1000)
        ratios.append((t2 - t1) / (t1 - t0))
    print(
        f"plan: {len(plan.launches)} launches, {len(plan.terminations)} terminations, "
        f"{len(plan.notes)} notes"
    )
    print(f"baseline (naive, every job x every offer): {statistics.median(base):.1f} ms")
    print(
        f"speed-up vs baseline: {statistics.median(ratios):.1f}x "
        f"(spread {min(ratios):.1f}-{max(ratios):.1f}, {rounds} interleaved rounds)"
    )
    figure = statistics.median(ours)
    print(
        f"one scaling decision: {figure:.1f} ms ({n_jobs:,} jobs x {n_offers} offers; "
        f"spread {min(ours):.1f}-{max(ours):.1f}; target <= 50 ms)"
    )
    return figure


# ------------------------------------------------------------------------------------------------
# what the ledger costs a job


async def _jobs_per(ledger: bool, n: int) -> float:
    """Seconds per no-op job through a ControlPlane on SQLite, its worker played in-process:
    submit, placed, started, finished (two ledger rows and an attempt record with the ledger)."""
    from gpulayer_kernel.contracts import CommandWorkload, FinishReport, JobSpec, WorkerRegistration
    from gpulayer_kernel.controlplane import ControlPlane
    from gpulayer_kernel.store import MemoryArtifactStore, SqliteStore

    store = SqliteStore(":memory:")
    await store.open()
    cp = ControlPlane(store, MemoryArtifactStore())
    await cp.start()
    if not ledger:
        cp.jobs.ledger = None
    wid = (await cp.register(WorkerRegistration(name="w"))).id
    spec = JobSpec(workload=CommandWorkload(argv=["true"]))
    t0 = time.perf_counter()
    for _ in range(n):
        job = await cp.submit(spec)
        a = (await cp.next_work(wid, wait=5)).assignments[0]
        await cp.report_started(wid, job.id, a.attempt)
        done = FinishReport(state="succeeded", exit_code=0, attempt=a.attempt)
        await cp.report_finished(wid, job.id, done)
    took = (time.perf_counter() - t0) / n
    await cp.close()
    await store.close()
    return took


def bench_ledger(rounds: int, n: int) -> None:
    import asyncio

    on, off, ratios = [], [], []
    asyncio.run(_jobs_per(True, 20))  # warm-up
    for _ in range(rounds):
        a, b = asyncio.run(_jobs_per(True, n)), asyncio.run(_jobs_per(False, n))
        on.append(a)
        off.append(b)
        ratios.append(a / b)
    print(
        f"ledger: {statistics.median(on) * 1e6:.0f} us a no-op job with it, "
        f"{statistics.median(off) * 1e6:.0f} us without: {statistics.median(ratios):.2f}x "
        f"(spread {min(ratios):.2f}-{max(ratios):.2f}, {rounds} rounds of {n} jobs)"
    )


# ------------------------------------------------------------------------------------------------
# cold start on real Slurm


def batch(cluster: Any, options: list[str], command: list[str]) -> None:
    """``sbatch --wrap`` the command and watch it end as a tight client would: ``squeue``
    every 50 ms (``sbatch --wait`` polls far more slowly, which would flatter GPUlayer)."""
    r = cluster.run("sbatch", "--parsable", *options, "--wrap", shlex.join(command))
    job = r.stdout.strip().split(";")[0]
    assert job.isdigit(), r.stdout + r.stderr
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = cluster.run("squeue", "-h", "-j", job, "-t", "all", "-o", "%T").stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            assert state == "COMPLETED", state
            return
        time.sleep(0.05)  # the baseline's own polling interval
    raise TimeoutError(f"batch job {job} did not end")


def bench_slurm(rounds: int) -> float | None:
    from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
    from gpulayer_kernel.testing import ServeProcess, wait_until
    from gpulayer_kernel.testing import slurm as slurm_testing

    why = slurm_testing.missing()
    if why is not None:
        print(f"slurm: skipped ({why})")
        return None
    tmp = Path(tempfile.mkdtemp(prefix="gl-bench-autoscale-"))
    command = [sys.executable, "-c", "print('hello from the job')"]
    try:
        with slurm_testing.SlurmCluster(tmp / "slurm") as cluster:
            home = tmp / "home"
            home.mkdir()
            (home / "providers.toml").write_text(cluster.provider_toml(idle_timeout=1))
            # The first Slurm job of a fresh cluster takes longer (~5 s): warm Slurm up once.
            batch(cluster, ["--output=/dev/null"], ["true"])
            ours, base, ratios, joins = [], [], [], []
            with ServeProcess(home, heartbeat_timeout=10) as server, server.client() as c:
                spec = JobSpec(
                    workload=CommandWorkload(argv=command),
                    resources={"gpus": 1},  # type: ignore[arg-type]
                    workdir=str(tmp),
                )
                for r in range(rounds + 1):
                    wait_until(lambda: not c.workers(), 60, what="the idle worker to end")
                    t0 = time.perf_counter()
                    job = c.wait(c.submit(spec).id, timeout=120)
                    t1 = time.perf_counter()
                    assert job.state == JobState.SUCCEEDED, job
                    inst = c.instances(ended=True).instances[0]
                    t2 = time.perf_counter()
                    batch(cluster, ["--gres=gpu:1", f"--output={tmp}/sbatch-%j.out"], command)
                    t3 = time.perf_counter()
                    if r == 0:
                        continue  # warm-up round
                    ours.append(t1 - t0)
                    base.append(t3 - t2)
                    ratios.append((t1 - t0) / (t3 - t2))
                    if inst.joined_at is not None:
                        joins.append(inst.joined_at - inst.requested_at)
        print(
            f"slurm: submit -> worker joined: {statistics.median(joins):.2f} s; "
            f"submit -> job finished: {statistics.median(ours):.2f} s "
            f"(spread {min(ours):.2f}-{max(ours):.2f})"
        )
        sbatch = statistics.median(base)
        print(f"slurm baseline, sbatch --wrap of the same command (squeue 50 ms): {sbatch:.2f} s")
        ratio = statistics.median(ratios)
        print(
            f"slurm cold start ratio (GPUlayer / sbatch): {ratio:.2f}x "
            f"(spread {min(ratios):.2f}-{max(ratios):.2f}, {rounds} interleaved rounds)"
        )
        return ratio
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="CI smoke size")
    parser.add_argument("--no-slurm", action="store_true", help="the decision only")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    print(f"machine: {describe()}")
    if args.quick:
        bench_ledger(1, 50)
        bench_decision(1_000, 20, args.rounds or 3)
    else:
        bench_ledger(args.rounds or 9, 300)
        bench_decision(10_000, 100, args.rounds or 15)
    if not args.no_slurm:
        bench_slurm(1 if args.quick else (args.rounds or 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
