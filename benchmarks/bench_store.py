"""Job transitions per second through the store's group commit, SQLite and PostgreSQL in one run;
and the failover time of an active–standby pair (leader kill → first job accepted by the new one).

A transition is one job written in its next state (queued → placed → running → succeeded), as
the control plane's job table writes them. Measured in the same rounds, interleaved:

- **one job per writer** (the figure the goal is about): many writers at once, as a busy control
  plane has them (``asyncio.gather`` of ``save_jobs([job])``; the group commit carries every
  write queued while a transaction runs);
- **asyncio alone**: the same gather of writers that store nothing (each awaits a future set on
  the next loop turn): what a task per writer costs before the store does anything — the ceiling
  of the line above on this machine;
- **batched**: writers of ``--batch`` jobs each (a scheduling pass, a batched worker report);
- **baseline**: the same writes one after the other, each awaited (one transaction each).

Goals (issue 14): ≥ 50,000/s SQLite, ≥ 10,000/s PostgreSQL on 2 cores; failover ≤ 5 s.

    python benchmarks/bench_store.py [--rounds 5] [--jobs 5000] [--quick] [--no-failover]
    python benchmarks/bench_store.py --against main      # also the store as it is at a git rev
    python benchmarks/bench_store.py --profile cpu|wall [--url URL]   # yappi, top entries

``--against REV`` imports ``gpulayer_kernel/store`` as it is at that revision (through
``git show``, beside this tree's contracts) and measures it in the same rounds: before and after
in one run. PostgreSQL is a scratch server started here (``gpulayer_kernel.testing.postgres``);
without its binaries only SQLite is measured. The last line is the figure the issue names.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpulayer_kernel.contracts import CommandWorkload, Job, JobSpec, JobState  # noqa: E402
from gpulayer_kernel.store import MetadataStore, open_store  # noqa: E402
from gpulayer_kernel.testing.postgres import PostgresServer, find_bin  # noqa: E402

STATES = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING, JobState.SUCCEEDED)
SPEC = JobSpec(name="bench", workload=CommandWorkload(argv=["true"]))
Opener = Callable[[str], MetadataStore]


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


async def batched(store: MetadataStore, waves: list[list[Job]], per: int) -> float:
    t = time.perf_counter()
    for wave in waves:
        await asyncio.gather(
            *(store.save_jobs(wave[i : i + per]) for i in range(0, len(wave), per))
        )
    return sum(map(len, waves)) / (time.perf_counter() - t)


async def asyncio_alone(waves: list[list[Job]]) -> float:
    loop = asyncio.get_running_loop()

    async def write(_job: Job) -> None:
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        await fut

    t = time.perf_counter()
    for wave in waves:
        await asyncio.gather(*(write(j) for j in wave))
    return sum(map(len, waves)) / (time.perf_counter() - t)


async def one_by_one(store: MetadataStore, waves: list[list[Job]]) -> float:
    t = time.perf_counter()
    for wave in waves:
        for j in wave:
            await store.save_jobs([j])
    return sum(map(len, waves)) / (time.perf_counter() - t)


async def measure(
    stores: dict[str, tuple[Opener, str]], rounds: int, jobs: int, per: int
) -> dict[str, list[float]]:
    """Interleaved rounds; ``stores``: label -> (open_store, URL). Figures per label and mode."""
    opened = {}
    for label, (opener, url) in stores.items():
        opened[label] = opener(url)
        await opened[label].open()
    out: dict[str, list[float]] = {}
    seq = iter(range(0, 10**10, jobs))
    try:
        for store in opened.values():
            await grouped(store, transitions(next(seq), 200))  # warm up
        base_jobs = max(50, jobs // 20)  # the baseline is slow: fewer writes, same rate
        for r in range(rounds):
            labels = list(opened) if r % 2 == 0 else list(reversed(opened))
            for label in labels:
                store = opened[label]
                run_on = store  # bound per label (the lambdas below run at once)
                # Each mode's jobs are made just before it runs: only they are alive (and
                # scanned by the garbage collector) while it is measured.
                runs: dict[str, Callable[[], Awaitable[float]]] = {
                    "grouped": lambda s=run_on: grouped(s, transitions(next(seq), jobs)),
                    "batched": lambda s=run_on: batched(s, transitions(next(seq), jobs), per),
                    "one by one": lambda s=run_on: one_by_one(s, transitions(next(seq), base_jobs)),
                }
                if label == "this tree":
                    runs["alone"] = lambda: asyncio_alone(transitions(next(seq), jobs))
                for mode, run in runs.items():
                    out.setdefault(f"{label}/{mode}", []).append(await run())
        return out
    finally:
        for store in opened.values():
            await store.close()


def store_at(rev: str) -> ModuleType:
    """``gpulayer_kernel.store`` as it is at git revision ``rev``, importable beside this one."""
    name = "store_at_" + re.sub(r"\W", "_", rev)
    folder = Path(tempfile.mkdtemp(prefix="gpulayer-bench-")) / name
    folder.mkdir()
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "gpulayer_kernel/store/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for path in (p for p in listing if p.endswith(".py")):
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        text = re.sub(r"^(\s*)from \.\.", r"\1from gpulayer_kernel.", text, flags=re.M)
        text = re.sub(r"^(\s*)from \.", rf"\1from {name}.", text, flags=re.M)
        (folder / Path(path).name).write_text(text)
    sys.path.insert(0, str(folder.parent))
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # before issue 14 the SQLite store ran on aiosqlite
        sys.exit(f"the store at {rev} does not import here ({exc}); pip install aiosqlite?")


def report(label: str, figures: dict[str, list[float]], per: int, against: str | None) -> float:
    med = {k: statistics.median(v) for k, v in figures.items()}
    here = "this tree"
    g, b = med[f"{here}/grouped"], med[f"{here}/batched"]
    alone, base = med[f"{here}/alone"], med[f"{here}/one by one"]
    print(
        f"{label}: {g:,.0f} transitions/s grouped, one job per writer (asyncio alone, no store: "
        f"{alone:,.0f}/s); {per} jobs per writer {b:,.0f}/s; baseline one by one {base:,.0f}/s; "
        f"{g / base:.1f}x"
    )
    if against:
        ratios = []
        for mode in ("grouped", "batched", "one by one"):
            pairs = zip(figures[f"{here}/{mode}"], figures[f"{against}/{mode}"], strict=True)
            each = [x / y for x, y in pairs]
            ratios.append(f"{statistics.median(each):.2f}x ({min(each):.2f}-{max(each):.2f})")
        print(
            f"{label} at {against}: {med[f'{against}/grouped']:,.0f}/s one job per writer, "
            f"{med[f'{against}/batched']:,.0f}/s {per} per writer, "
            f"{med[f'{against}/one by one']:,.0f}/s one by one; this tree / {against}, per "
            f"round: {', '.join(ratios)}"
        )
    return g


def profile(url: str, jobs: int, clock: str, top: int = 15) -> None:
    """One grouped round under yappi (``clock``: cpu or wall): the functions with the most own
    time, every thread together, and each thread's total. yappi slows every Python call several
    times over, so read the shares, not the rate. In wall time a coroutine's own time includes
    the time it spent suspended, so those over the round's length are left out."""
    try:
        import yappi
    except ImportError:
        sys.exit("--profile needs yappi: .venv/bin/python -m pip install yappi")

    async def run() -> tuple[float, float]:
        store = open_store(url)
        await store.open()
        try:
            await grouped(store, transitions(10**9, 200))  # warm up
            waves = transitions(0, jobs)
            yappi.set_clock_type(clock)
            yappi.start(builtins=True, profile_threads=True)
            t = time.perf_counter()
            try:
                return await grouped(store, waves), time.perf_counter() - t
            finally:
                yappi.stop()
        finally:
            await store.close()

    rate, wall = asyncio.run(run())
    stats = yappi.get_func_stats()
    total = sum(t.ttot for t in yappi.get_thread_stats()) or 1.0
    print(
        f"profile ({clock} clock, {jobs:,} jobs, {4 * jobs:,} transitions): {rate:,.0f}/s "
        f"under yappi; {total:.3f} s in all threads"
    )
    print("  own time  share      calls  function")
    shown = [s for s in stats if clock == "cpu" or s.tsub <= wall]
    for s in sorted(shown, key=lambda s: s.tsub, reverse=True)[:top]:
        where = f"{Path(s.module).name}:{s.lineno}" if s.lineno else Path(s.module).name
        print(f"  {s.tsub:7.3f}s {s.tsub / total:6.1%} {s.ncall:10,}  {s.name} ({where})")
    for t in yappi.get_thread_stats():
        print(f"  thread {t.name}: {t.ttot:.3f} s")
    yappi.clear_stats()


def failover_seconds(pg: PostgresServer, folder: Path, rounds: int) -> list[float]:
    from gpulayer_kernel.client.clients import Client
    from gpulayer_kernel.errors import Unavailable
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
                    # Fails over: connection refused, then b's answers. A submit sent on the
                    # kept-alive connection as the leader died is not retried by the client
                    # (it may have been taken): the user sends it again, and so does this.
                    while True:
                        try:
                            c.submit(SPEC)
                            break
                        except Unavailable:
                            if time.monotonic() - t > 30:
                                raise
                    out.append(time.monotonic() - t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=5000, help="jobs per round (4 transitions each)")
    p.add_argument("--batch", type=int, default=50, help="jobs per writer in the batched line")
    p.add_argument("--quick", action="store_true", help="CI smoke size")
    p.add_argument("--no-failover", action="store_true")
    p.add_argument("--against", metavar="REV", help="also measure the store at this git rev")
    p.add_argument("--profile", choices=("cpu", "wall"), help="profile one grouped round (yappi)")
    p.add_argument("--url", help="the store to profile (default: a scratch SQLite file)")
    a = p.parse_args()
    if a.profile:
        with tempfile.TemporaryDirectory() as tmp:
            profile(a.url or f"sqlite://{tmp}/bench.db", a.jobs, a.profile)
        return
    rounds, jobs = (2, 300) if a.quick else (a.rounds, a.jobs)
    print(f"machine: {describe()}")
    openers: dict[str, Opener] = {"this tree": open_store}
    if a.against:
        openers[a.against] = store_at(a.against).open_store
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sqlite = {
            k: (o, f"sqlite://{folder / f'{i}.db'}") for i, (k, o) in enumerate(openers.items())
        }
        figures["sqlite"] = report(
            "sqlite", asyncio.run(measure(sqlite, rounds, jobs, a.batch)), a.batch, a.against
        )
        if find_bin() is None:
            print("postgresql: skipped (PostgreSQL is not installed)")
        else:
            with PostgresServer() as pg:
                urls = {k: (o, pg.create_database()) for k, o in openers.items()}
                figures["postgresql"] = report(
                    "postgresql", asyncio.run(measure(urls, rounds, jobs, a.batch)), a.batch,
                    a.against,
                )  # fmt: skip
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
