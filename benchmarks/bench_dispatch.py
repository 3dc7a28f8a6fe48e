"""End-to-end time of a trivial job through the embedded control plane and local worker.

Measures submit → first log line → finished for ``python -c "print(1)"`` through a ControlPlane on
SQLite with an in-process worker, against the bare ``subprocess.run`` it wraps, in the same run,
interleaved round by round (BENCHMARKING.md). Target: ≤ 1.3× (the interpreter's spawn is the floor).

In the same rounds, an embedded Python job (``ControlPlane.run`` of the cell ``print(1); 1 + 1``:
its result and log line in hand) against ipyparallel's ``apply_sync`` on one engine and a Ray
task, where installed (``--no-anchors`` skips them). Beside each wall time, the CPU per job
(``_cpu.py``): this process's own (the control plane, the worker, the anchors' clients) plus the
process trees of the way measured, read from ``/proc`` around each call: GPUlayer's zygotes with
their spares and jobs, ipyparallel's controller and engine, Ray's GCS, raylet and workers. Work a
job leaves behind (its spare's replacement) is waited for inside its window, so it is counted.

The last line is the median per-round ratio of the embedded Python job to ``apply_sync``
(target ≤ 1.0×), or the command job's ``dispatch/bare`` without anchors.

    python benchmarks/bench_dispatch.py [--rounds 20] [--block 10] [--quick] [--no-anchors]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _cpu import BlockCpu, children_of  # benchmarks/_cpu.py (scripts run from benchmarks/)
from _machine import describe

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import (
    CommandWorkload,
    JobSpec,
    JobState,
    PythonWorkload,
    WorkerCapabilities,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport

ARGV = [sys.executable, "-c", "print(1)"]
CELL_DIGEST, CELL_BUNDLE = bundles.build({"cell.py": b"print(1)\n1 + 1\n"})
CELL = JobSpec(name="cell", workload=PythonWorkload(bundle=CELL_DIGEST, entrypoint="cell:cell.py"))
# The same cell, judged torch-needing (an import that never runs): it forks from the torch-loaded
# zygote, as every Python job did before light spares (issue 25).
HEAVY_DIGEST, HEAVY_BUNDLE = bundles.build(
    {"cell.py": b"if False:\n    import torch\nprint(1)\n1 + 1\n"}
)
HEAVY = JobSpec(
    name="cell", workload=PythonWorkload(bundle=HEAVY_DIGEST, entrypoint="cell:cell.py")
)


def bare() -> float:
    start = time.perf_counter()
    subprocess.run(ARGV, check=True, capture_output=True)
    return time.perf_counter() - start


async def through_gpulayer(cp: ControlPlane) -> tuple[float, float]:
    """Returns (submit → first log line, submit → finished)."""
    start = time.perf_counter()
    job = await cp.submit(JobSpec(workload=CommandWorkload(argv=ARGV)))
    first = None
    since = 0
    while True:
        page = await cp.logs(job.id, since=since, wait=10)
        since = page.next_since
        if first is None and any(r.stream == "stdout" for r in page.records):
            first = time.perf_counter() - start
        if page.state.terminal:
            break
    done = await cp.wait(job.id)
    end = time.perf_counter() - start
    assert done.state == JobState.SUCCEEDED, done
    return first or end, end


async def python_job(cp: ControlPlane, heavy: bool = False) -> float:
    """An embedded Python job's result and log line in hand (``run``, as the Python API)."""
    start = time.perf_counter()
    page = await cp.run(*((HEAVY, HEAVY_BUNDLE) if heavy else (CELL, CELL_BUNDLE)), wait=60)
    records = list(page.records)
    while not page.job.state.terminal or page.more:
        page = await cp.follow(page.job.id, since=page.next_since, cursor=page.cursor, wait=60)
        records += page.records
    elapsed = time.perf_counter() - start
    job = page.job
    assert job.state == JobState.SUCCEEDED and job.result == 2, (job.state, job.reason)
    assert "1" in [r.text for r in records], records
    return elapsed


def _add(a: int, b: int) -> int:
    return a + b


def start_anchors(
    stops: list[Callable[[], object]],
) -> dict[str, tuple[Callable[[], float], set[int]]]:
    """ipyparallel (one engine, ``apply_sync``) and Ray (a task): each call, and the processes
    it started (their trees are its CPU)."""
    ways: dict[str, tuple[Callable[[], float], set[int]]] = {}
    me = os.getpid()
    if importlib.util.find_spec("ipyparallel"):
        import ipyparallel as ipp

        before = children_of(me)
        rc = ipp.Cluster(n=1, log_level=40).start_and_connect_sync()
        stops.append(rc.cluster.stop_cluster_sync)
        rc.wait_for_engines(1)
        view = rc[0]

        def ipp_call() -> float:
            t0 = time.perf_counter()
            assert view.apply_sync(_add, 1, 1) == 2
            return time.perf_counter() - t0

        ways["ipyparallel"] = (ipp_call, children_of(me) - before)
    if importlib.util.find_spec("ray"):
        import ray

        before = children_of(me)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=40)
        stops.append(ray.shutdown)
        task = ray.remote(_add)

        def ray_call() -> float:
            t0 = time.perf_counter()
            assert ray.get(task.remote(1, 1)) == 2
            return time.perf_counter() - t0

        ways["ray"] = (ray_call, children_of(me) - before)
    return ways


async def main(rounds: int, anchors: bool, block: int) -> None:
    print(f"machine: {describe()}")
    stops: list[Callable[[], object]] = []
    times: dict[str, list[float]] = {}
    cpu = BlockCpu()
    me = os.getpid()
    try:
        others = start_anchors(stops) if anchors else {}
        with tempfile.TemporaryDirectory() as d:
            store = SqliteStore(Path(d) / "db")
            await store.open()
            cp = ControlPlane(store, LocalArtifactStore(Path(d) / "a"))
            await cp.start()
            agent = WorkerAgent(
                InProcessTransport(cp),
                WorkerRegistration(name="bench", capabilities=WorkerCapabilities()),
                ExecutorConfig(work_root=Path(d) / "work"),
            )
            await agent.start()
            before = children_of(me)
            for _ in range(3):  # warm up both paths; starts the worker's zygotes
                bare()
                await through_gpulayer(cp)
                await python_job(cp)
            runner = agent.warm_runner
            ours = {f"gl{i}": pid for i, pid in enumerate(children_of(me) - before)}

            async def settled() -> None:
                """The spares a job used are replaced: their fork is that job's CPU too."""
                pool = agent.config.warm_pool
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and (
                    runner.spares() < pool or runner.spares(light=True) < pool
                ):
                    await asyncio.sleep(0.002)

            async def gl(call: Callable[[], Awaitable[Any]]) -> float:
                t0 = time.perf_counter()
                await call()
                return time.perf_counter() - t0

            ways: dict[str, tuple[Callable[[], Awaitable[float]], dict[str, int]]] = {
                "command": (lambda: gl(lambda: through_gpulayer(cp)), ours),
                "python": (lambda: python_job(cp), ours),
                "torch-zygote": (lambda: python_job(cp, heavy=True), ours),
            }
            for name, (call, pids) in others.items():
                ways[name] = (_async(call), {f"{name}{i}": p for i, p in enumerate(pids)})
            await settled()
            order = ["bare", *ways]
            times = {name: [] for name in order}
            for i in range(rounds):
                k = i % len(order)
                for name in order[k:] + order[:k]:
                    if name == "bare":
                        times[name].append(statistics.median(bare() for _ in range(block)))
                        continue
                    # CPU is read around a block of calls: /proc counts in 10 ms ticks, and a
                    # scan of it costs milliseconds of the trees' background.
                    call, roots = ways[name]
                    at = cpu.before(roots)
                    walls = [await call() for _ in range(block)]
                    if roots is ours:
                        await settled()
                    cpu.after(name, roots, at, block)
                    times[name].append(statistics.median(walls))
            await agent.stop()
            await cp.close()
            await store.close()
    finally:
        for stop in reversed(stops):
            try:
                stop()
            except Exception as exc:  # the figures are printed; say what did not stop
                print(f"(anchors) stopping failed: {exc}", file=sys.stderr)
    report(rounds, times, cpu)


def _async(call: Callable[[], float]) -> Callable[[], Awaitable[float]]:
    async def run() -> float:
        return call()

    return run


def report(rounds: int, times: dict[str, list[float]], cpu: BlockCpu) -> None:
    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1000:.2f} ms"

    def ratio(a: str, b: str) -> tuple[float, str]:
        rs = [x / y for x, y in zip(times[a], times[b], strict=True)]
        q = statistics.quantiles(rs, n=4) if len(rs) > 1 else [rs[0]] * 3
        return statistics.median(rs), f"p25-p75 {q[0]:.2f}-{q[2]:.2f}"

    print(
        f"rounds: {rounds} (interleaved; wall: median of each round's block of calls; "
        "CPU = this process + the way's process trees, per call)"
    )
    print(f"bare subprocess.run:             {ms(times['bare'])} wall")
    labels = {
        "command": "gpulayer command job:           ",
        "python": "gpulayer embedded Python job:   ",
        "torch-zygote": "  same, from the torch zygote:  ",
        "ipyparallel": "ipyparallel apply_sync, 1 eng.: ",
        "ray": "Ray task (ray.get(f.remote())): ",
    }
    for name in ("command", "python", "torch-zygote", "ipyparallel", "ray"):
        if name in times:
            print(f"{labels[name]}{ms(times[name])} wall, {cpu.per_call_ms(name):.2f} ms CPU")
    r, spread = ratio("command", "bare")
    print(f"command job/bare: {r:.2f}x ({spread})")
    last = f"dispatch/bare: {r:.2f}x"
    r, spread = ratio("python", "torch-zygote")
    c = cpu.per_call_ms("python") / max(cpu.per_call_ms("torch-zygote"), 1e-9)
    print(f"Python job, light / torch zygote: {r:.2f}x wall ({spread}), {c:.2f}x CPU")
    for anchor in ("ray", "ipyparallel"):
        if anchor in times:
            r, spread = ratio("python", anchor)
            c = cpu.per_call_ms("python") / max(cpu.per_call_ms(anchor), 1e-9)
            print(f"Python job/{anchor}: {r:.2f}x wall ({spread}), {c:.2f}x CPU")
            last = f"python job/{anchor}: {r:.2f}x"
    print(last)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="a few rounds, for a smoke test")
    p.add_argument("--no-anchors", action="store_true", help="skip ipyparallel and Ray")
    p.add_argument("--block", type=int, default=10, help="calls per way per round")
    a = p.parse_args()
    asyncio.run(main(5 if a.quick else a.rounds, not a.no_anchors, 2 if a.quick else a.block))
