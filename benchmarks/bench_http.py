"""The HTTP path: a trivial job's round trip, and control-plane throughput with no-op workers.

    .venv/bin/python benchmarks/bench_http.py [--rounds N] [--seconds S] [--quick]

(a) Round trip of ``python -c "print(1)"`` from submit to its output in hand, three ways, in
    interleaved rounds (the order rotates each round), after a warm-up:
      * http:     ``gpulayer serve`` (subprocess) + one ``gpulayer worker`` (subprocess); this
                  process submits with ``AsyncClient``, waits for the end, reads the log page;
      * embedded: an in-process ``Embedded`` (ControlPlane + local worker), the same calls;
      * bare:     ``subprocess.run([python, "-c", "print(1)"])``.
    Prints medians and the median of the per-round ratios (http/bare, embedded/bare).
(b) Throughput: jobs/s through submit -> assign -> started -> finished, with 8 fake workers in
    this process speaking HTTP through ``HttpTransport`` whose "executor" reports started and
    finished at once (this measures the control plane and the protocol, not process spawns),
    against ``gpulayer serve`` in a subprocess; submissions keep ``--inflight`` jobs in flight.

The last line is (b), e.g. ``throughput: 612 jobs/s (8 workers, no-op executor)``.
Targets on a 2-core machine: (a) http <= 1.5x bare; (b) >= 500 jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpulayer_kernel.client import AsyncClient  # noqa: E402
from gpulayer_kernel.contracts import (  # noqa: E402
    CommandWorkload,
    FinishReport,
    JobSpec,
    JobState,
    WorkerRegistration,
)
from gpulayer_kernel.embedded import Embedded  # noqa: E402
from gpulayer_kernel.testing import ServeProcess, WorkerProcess  # noqa: E402
from gpulayer_kernel.worker.http import HttpTransport  # noqa: E402

TRIVIAL = [sys.executable, "-c", "print(1)"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (0 where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(values: list[float]) -> str:
    if len(values) < 4:
        return "n/a"
    q = statistics.quantiles(values, n=4)
    return f"IQR {q[0]:.2f}-{q[2]:.2f}"


async def round_trip(session: object, spec: JobSpec) -> float:
    t0 = time.perf_counter()
    job = await session.submit(spec)  # type: ignore[attr-defined]
    job = await session.wait(job.id, timeout=60)  # type: ignore[attr-defined]
    page = await session.logs(job.id)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t0
    if job.state != JobState.SUCCEEDED or "1" not in [r.text for r in page.records]:
        raise RuntimeError(f"job {job.id} ended {job.state}: {job.reason}")
    return elapsed


def bare() -> float:
    t0 = time.perf_counter()
    out = subprocess.run(TRIVIAL, capture_output=True, text=True, check=True).stdout
    elapsed = time.perf_counter() - t0
    assert out == "1\n"
    return elapsed


async def latency(rounds: int, tmp: Path) -> None:
    spec = JobSpec(name="trivial", workload=CommandWorkload(argv=TRIVIAL))
    with ServeProcess(tmp / "serve-home") as server:
        join = server.create_token("join")
        with WorkerProcess(server.url, join, name="bench-w", simulate_gpus=1, home=tmp / "worker"):
            emb = Embedded(tmp / "embedded-home", local_worker=True, simulate_gpus=1)
            await emb.start()
            try:
                async with AsyncClient(server.url, server.admin_token) as client:
                    ways = {
                        "http": lambda: round_trip(client, spec),
                        "embedded": lambda: round_trip(emb.cp, spec),
                    }
                    for _ in range(5):  # warm-up: imports, caches, connections
                        for fn in ways.values():
                            await fn()
                        bare()
                    times: dict[str, list[float]] = {"http": [], "embedded": [], "bare": []}
                    order = ["http", "embedded", "bare"]
                    for i in range(rounds):
                        for name in order[i % 3 :] + order[: i % 3]:
                            t = bare() if name == "bare" else await ways[name]()
                            times[name].append(t)
            finally:
                await emb.stop()
    ms = {k: [1000 * v for v in vs] for k, vs in times.items()}
    for name in ("bare", "embedded", "http"):
        print(
            f"(a) {name:<9} median {statistics.median(ms[name]):6.1f} ms  "
            f"({spread(ms[name])} ms, {rounds} rounds)"
        )
    for name in ("embedded", "http"):
        ratios = [a / b for a, b in zip(times[name], times["bare"], strict=True)]
        print(f"(a) {name}/bare: {statistics.median(ratios):.2f}x  ({spread(ratios)})")


async def fake_worker(
    url: str, join: str, i: int, done: asyncio.Queue[str], stop: asyncio.Event
) -> None:
    t = HttpTransport(url, join)

    async def run(job_id: str) -> None:
        # What the agent does around a job, with no process: started, then finished.
        await t.report_started(job_id)
        await t.report_finished(job_id, FinishReport(state="succeeded", exit_code=0))
        done.put_nowait(job_id)

    running: set[asyncio.Task[None]] = set()
    try:
        await t.register(WorkerRegistration(name=f"fake-{i}"))
        while not stop.is_set():
            work = await t.next_work(0.5)
            for a in work.assignments:  # like the agent: each job its own task
                task = asyncio.create_task(run(a.job.id))
                running.add(task)
                task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await t.close()


async def throughput(
    seconds: float, workers: int, inflight: int, tmp: Path, submitters: int = 16
) -> float:
    spec = JobSpec(name="noop", workload=CommandWorkload(argv=["true"]))
    with ServeProcess(tmp / "tp-home", heartbeat_timeout=120) as server:
        join = server.create_token("join")
        done: asyncio.Queue[str] = asyncio.Queue()
        stop = asyncio.Event()
        fakes = [
            asyncio.create_task(fake_worker(server.url, join, i, done, stop))
            for i in range(workers)
        ]
        async with AsyncClient(server.url, server.admin_token) as client:
            while len(await client.workers()) < workers:
                await asyncio.sleep(0.05)
            slots = asyncio.Semaphore(inflight)
            submitted = 0

            async def submitter() -> None:
                nonlocal submitted
                while not stop.is_set():
                    await slots.acquire()
                    await client.submit(spec)
                    submitted += 1

            async def counter(until: float) -> int:
                n = 0
                while time.perf_counter() < until:
                    try:
                        await asyncio.wait_for(done.get(), until - time.perf_counter())
                    except TimeoutError:
                        break
                    slots.release()
                    n += 1
                return n

            subs = [asyncio.create_task(submitter()) for _ in range(submitters)]
            await counter(time.perf_counter() + min(1.0, seconds / 2))  # warm-up
            cpu0 = cpu_seconds(server.pid), time.process_time()
            t0 = time.perf_counter()
            n = await counter(t0 + seconds)
            elapsed = time.perf_counter() - t0
            cpu1 = cpu_seconds(server.pid), time.process_time()
            stop.set()
            for task in subs:
                task.cancel()
            while not done.empty():
                done.get_nowait()
                slots.release()
            await asyncio.gather(*subs, return_exceptions=True)
            await asyncio.gather(*fakes, return_exceptions=True)
    rate = n / elapsed
    server_ms = 1000 * (cpu1[0] - cpu0[0]) / max(1, n)
    client_ms = 1000 * (cpu1[1] - cpu0[1]) / max(1, n)
    print(
        f"(b) {n} jobs finished in {elapsed:.2f}s with {workers} no-op workers over HTTP, "
        f"{inflight} in flight, {submitters} concurrent submitters ({submitted} submitted)"
    )
    print(
        f"(b) CPU per job: server {server_ms:.2f} ms (so one core serves ~"
        f"{1000 / max(server_ms, 1e-3):.0f} jobs/s), fake workers + submitter {client_ms:.2f} ms"
    )
    return rate


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="latency rounds (default 30)")
    p.add_argument("--seconds", type=float, default=5.0, help="throughput window (default 5)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="a smoke run for CI")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 3, 1.0
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_HOME"):
        os.environ.pop(var, None)
    print(f"machine: {describe()}")
    with tempfile.TemporaryDirectory(prefix="gl-bench-http-") as d:
        tmp = Path(d)
        os.environ["GPULAYER_HOME"] = str(tmp / "default-home")
        await latency(args.rounds, tmp)
        rate = await throughput(args.seconds, args.workers, args.inflight, tmp)
    print(f"throughput: {rate:.0f} jobs/s ({args.workers} workers, no-op executor)")


if __name__ == "__main__":
    asyncio.run(main())
