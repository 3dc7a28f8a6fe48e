"""Job transitions per second through the store's group commit, SQLite and PostgreSQL in one run;
and the failover time of an active–standby pair (leader kill → first job accepted by the new one).

A transition is one ``save_jobs([job])`` of a job in its next state (queued → placed → running →
succeeded), as the control plane's job table writes them. Candidate: many writers at once, as a
busy control plane has them (``asyncio.gather``; the group commit carries every write queued
while a transaction runs). Baseline, in the same rounds, interleaved: the same writes one after
the other, each awaited (one transaction each: what there is without batching). Goals: ≥ 50,000/s
SQLite, ≥ 10,000/s PostgreSQL on 2 cores; failover ≤ 5 s.

    python benchmarks/bench_store.py [--rounds 5] [--jobs 5000] [--quick] [--no-failover]

PostgreSQL is a scratch server started here (``gpulayer_kernel.testing.postgres``); without its
binaries only SQLite is measured. The last line is the figure the issue names.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpulayer_kernel.contracts import CommandWorkload, Job, JobSpec, JobState
from gpulayer_kernel.store import MetadataStore, open_store
from gpulayer_kernel.testing.postgres import PostgresServer, find_bin

STATES = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING, JobState.SUCCEEDED)
SPEC = JobSpec(name="bench", workload=CommandWorkload(argv=["true"]))


def transitions(start: int, jobs: int) -> list[list[Job]]:
    """Per state, every job in it (``jobs`` jobs numbered from ``start``)."""
    base = [
        Job(id=f"j{start + i:011d}", seq=start + i, spec=SPEC, submitted_at=1.0)
        for i in range(jobs)
    ]
    return [[j.model_copy(update={"state": s}) for j in base] for s in STATES]


async def grouped(store: MetadataStore, waves: list[list[Job]]) -> float:
    t = time.perf_counter()
    for wave in waves:  # each state after the last, all jobs of a state at once
        await asyncio.gather(*(store.save_jobs([j]) for j in wave))
    return sum(map(len, waves)) / (time.perf_counter() - t)


async def one_by_one(store: MetadataStore, waves: list[list[Job]]) -> float:
    t = time.perf_counter()
    for wave in waves:
        for j in wave:
            await store.save_jobs([j])
    return sum(map(len, waves)) / (time.perf_counter() - t)


async def measure(url: str, rounds: int, jobs: int) -> tuple[float, float, float]:
    store = open_store(url)
    await store.open()
    try:
        await grouped(store, transitions(10**9, 200))  # warm up
        cands, bases, ratios = [], [], []
        base_jobs = max(50, jobs // 20)  # the baseline is slow: fewer writes, same rate
        for r in range(rounds):
            start = r * 2 * jobs
            c = await grouped(store, transitions(start, jobs))
            b = await one_by_one(store, transitions(start + jobs, base_jobs))
            cands.append(c)
            bases.append(b)
            ratios.append(c / b)
        return statistics.median(cands), statistics.median(bases), statistics.median(ratios)
    finally:
        await store.close()


def failover_seconds(pg: PostgresServer, folder: Path, rounds: int) -> list[float]:
    from gpulayer_kernel.client import Client
    from gpulayer_kernel.testing import ServeProcess

    out = []
    for r in range(rounds):
        db = pg.create_database()
        args = ("--db", db, "--artifacts", str(folder / f"art{r}"), "--secrets-key",
                str(folder / f"key{r}"))  # fmt: skip
        with ServeProcess(folder / f"a{r}", args=args, standby=True) as a:
            a.wait_leading()
            with ServeProcess(folder / f"b{r}", args=args, standby=True) as b:
                with Client(f"{a.url},{b.url}", a.admin_token) as c:
                    c.submit(SPEC)
                    a.kill()
                    t = time.monotonic()
                    c.submit(SPEC)  # fails over: connection refused, then b's answers
                    out.append(time.monotonic() - t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=5000, help="jobs per round (4 transitions each)")
    p.add_argument("--quick", action="store_true", help="CI smoke size")
    p.add_argument("--no-failover", action="store_true")
    a = p.parse_args()
    rounds, jobs = (2, 300) if a.quick else (a.rounds, a.jobs)
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        c, b, ratio = asyncio.run(measure(f"sqlite://{folder / 'bench.db'}", rounds, jobs))
        print(
            f"sqlite: {c:,.0f} transitions/s grouped; baseline one by one {b:,.0f}/s; {ratio:.1f}x"
        )
        figures["sqlite"] = c
        if find_bin() is None:
            print("postgresql: skipped (PostgreSQL is not installed)")
        else:
            with PostgresServer() as pg:
                c, b, ratio = asyncio.run(measure(pg.create_database(), rounds, jobs))
                print(
                    f"postgresql: {c:,.0f} transitions/s grouped; baseline one by one "
                    f"{b:,.0f}/s; {ratio:.1f}x"
                )
                figures["postgresql"] = c
                if not a.no_failover and not a.quick:
                    times = failover_seconds(pg, folder, max(1, rounds // 2))
                    each = ", ".join(f"{t:.2f}" for t in times)
                    print(
                        f"failover: leader kill -> first job accepted by the new leader "
                        f"{statistics.median(times):.2f} s median (of {each})"
                    )
    print("transitions/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
