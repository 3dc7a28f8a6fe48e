"""End-to-end time of a trivial job through the embedded control plane and local worker.

Measures submit → first log line → finished for ``python -c "print(1)"`` through a ControlPlane on
SQLite with an in-process worker, against the bare ``subprocess.run`` it wraps, in the same run,
interleaved round by round (BENCHMARKING.md). Prints both medians and, last, the median of the
per-round ratios. Target: ≤ 1.3× (the interpreter's spawn is the floor).

    python benchmarks/bench_dispatch.py [--rounds 40] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpulayer_kernel.contracts import (
    CommandWorkload,
    JobSpec,
    JobState,
    WorkerCapabilities,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport

ARGV = [sys.executable, "-c", "print(1)"]


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


async def main(rounds: int) -> None:
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
        for _ in range(3):  # warm up both paths
            bare()
            await through_gpulayer(cp)
        bares, firsts, ends, ratios = [], [], [], []
        for _ in range(rounds):
            b = bare()
            f, e = await through_gpulayer(cp)
            bares.append(b)
            firsts.append(f)
            ends.append(e)
            ratios.append(e / b)
        await agent.stop()
        await cp.close()
        await store.close()
    ms = lambda xs: f"{statistics.median(xs) * 1000:.1f} ms"  # noqa: E731
    q = statistics.quantiles(ratios, n=4)
    print(f"rounds: {rounds}")
    print(f"bare subprocess.run: {ms(bares)} (median)")
    print(f"gpulayer submit -> first log line: {ms(firsts)} (median)")
    print(f"gpulayer submit -> finished: {ms(ends)} (median)")
    print(f"ratio spread (p25-p75): {q[0]:.2f}x-{q[2]:.2f}x")
    print(f"dispatch/bare: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--quick", action="store_true", help="a few rounds, for a smoke test")
    a = p.parse_args()
    asyncio.run(main(5 if a.quick else a.rounds))
