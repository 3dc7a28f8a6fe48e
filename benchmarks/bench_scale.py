"""One control plane at scale, by simulation (issue 35): thousands of workers, a deep queue.

    .venv/bin/python benchmarks/bench_scale.py [--workers 500,5000] [--jobs 100000] [--db sqlite]

For each worker count: one ``gpulayer serve`` (SQLite, or ``--db postgres``: a real PostgreSQL
started here), and that many simulated workers, 8 GPUs each (``--gpus``), held by a few processes
(``--procs``) over real HTTP (``--tunnel``: on the worker tunnel, ADR 0003): each joins,
long-polls its work, holds each job ``--hold`` seconds and reports it done (protocol 1.1's
batched reports), as ``gpulayer worker`` does. ``--jobs``
jobs of one GPU wait in the queue (submitted in batches first). Then, for ``--seconds``:

- **submit**: single ``POST /jobs`` from this process, spaced ``--gap`` apart: p50 and p99;
- **placing a freed GPU**: at each worker, from a job's end report to the next assignment the
  worker gets (the freed GPU placed again; p50 and p99);
- **the scheduling pass**: from the server's ``/metrics`` (``gpulayer_scheduling_pass_seconds``);
- **the server's RSS and CPU** (``/proc``), and the requests over 1 s that are no long-poll
  (the server's request histogram): those of the measured window (the target: none), and apart,
  those while the workers joined and the queue filled.

One line per worker count, then how each figure grew from the first count to the last; the last
line says the targets: ``submit p99 <= 100 ms, RSS <= 1 GiB, no request over 1 s``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from _cpu import TreeCpu  # benchmarks/_cpu.py
from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gpulayer_kernel import versions  # noqa: E402
from gpulayer_kernel.contracts import (  # noqa: E402
    PROTOCOL,
    CommandWorkload,
    Device,
    FinishReport,
    JobSpec,
    Resources,
    WorkerCapabilities,
    WorkerRegistration,
)
from gpulayer_kernel.testing import ServeProcess  # noqa: E402
from gpulayer_kernel.worker.http import HttpTransport  # noqa: E402
from gpulayer_kernel.worker.reports import Reporter  # noqa: E402

LONG_POLLS = ("/worker/work", "/follow", "/wait", "/events", "/frames")


class Shared(NamedTuple):
    joined: Any  # multiprocessing.Value("q"): workers joined so far
    stop: Any  # multiprocessing.Event
    replaced: Any  # multiprocessing.Queue of (seconds from a job's end to the next assignment)


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def caps(gpus: int) -> WorkerCapabilities:
    devices = [
        Device(index=i, vendor="sim", name="Simulated H100", kind="h100", memory_bytes=80 << 30)
        for i in range(gpus)
    ]
    return WorkerCapabilities(devices=devices, simulated=True)


def _workers_proc(url: str, join: str, first: int, count: int, gpus: int, hold: float,
                  shared: Shared, tunnel: bool) -> None:  # fmt: skip
    raise_fd_limit()
    asyncio.run(_workers(url, join, first, count, gpus, hold, shared, tunnel))


async def _workers(url: str, join: str, first: int, count: int, gpus: int, hold: float,
                   shared: Shared, tunnel: bool) -> None:  # fmt: skip
    stop = asyncio.Event()

    async def watch() -> None:
        while not shared.stop.is_set():
            await asyncio.sleep(0.1)
        stop.set()

    watcher = asyncio.create_task(watch())
    # Joins in waves: 5,000 at once would be a join storm no real fleet makes.
    sem = asyncio.Semaphore(64)
    await asyncio.gather(
        *(
            fake_worker(url, join, first + i, gpus, hold, shared, stop, sem, tunnel)
            for i in range(count)
        )
    )
    watcher.cancel()


async def fake_worker(url: str, join: str, i: int, gpus: int, hold: float, shared: Shared,
                      stop: asyncio.Event, sem: asyncio.Semaphore,
                      tunnel: bool) -> None:  # fmt: skip
    t = HttpTransport(url, join, timeout=120.0, tunnel=tunnel)
    reporter = Reporter(t.report)
    freed: list[float] = []  # when each of this worker's GPUs was freed, oldest first
    running: set[asyncio.Task[None]] = set()

    async def run(job_id: str, attempt: int | None) -> None:
        reporter.started(job_id, attempt)
        await asyncio.sleep(hold)
        freed.append(time.monotonic())
        await reporter.finished(job_id, attempt, FinishReport(state="succeeded", exit_code=0))

    try:
        async with sem:
            await t.register(WorkerRegistration(name=f"sim-{i:05d}", capabilities=caps(gpus)))
        with shared.joined.get_lock():
            shared.joined.value += 1
        while not stop.is_set():
            work = await t.next_work(t.max_wait)
            now = time.monotonic()
            for a in work.assignments:
                if freed:
                    shared.replaced.put(now - freed.pop(0))
                task = asyncio.create_task(run(a.job.id, a.attempt))
                running.add(task)
                task.add_done_callback(running.discard)
    except Exception as exc:  # a worker that fails says so once; the run goes on
        if not stop.is_set():
            print(f"sim-{i:05d}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await reporter.close()
        await t.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def histogram(metrics: str, name: str) -> tuple[float, float]:
    """(count, mean seconds) of a histogram in the server's Prometheus text."""
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith(f"{name}_sum"):
            total = float(line.split()[-1])
        elif line.startswith(f"{name}_count"):
            count = float(line.split()[-1])
    return count, (total / count if count else float("nan"))


def pass_seconds(metrics: str) -> tuple[float, float]:
    """(passes, mean seconds a pass) from the server's Prometheus text."""
    return histogram(metrics, "gpulayer_scheduling_pass_seconds")


def over_a_second(metrics: str) -> dict[str, int]:
    """Requests that took more than 1 s, by route and method, long-polls left out (from the
    server's ``gpulayer_http_request_duration_seconds`` histogram)."""
    under: dict[str, float] = {}
    count: dict[str, float] = {}
    series = re.compile(r"gpulayer_http_request_duration_seconds_(bucket|count)\{(.*)\} (\S+)")
    for m in series.finditer(metrics):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if any(p in labels.get("route", "") for p in LONG_POLLS):
            continue
        key = f"{labels.get('method', '?')} {labels.get('route', '?')}"
        if m.group(1) == "count":
            count[key] = count.get(key, 0.0) + float(m.group(3))
        elif labels.get("le") == "1.0":
            under[key] = under.get(key, 0.0) + float(m.group(3))
    return {k: int(n - under.get(k, 0.0)) for k, n in count.items() if n > under.get(k, 0.0)}


async def submit_jobs(client: httpx.AsyncClient, n: int, batch: int = 1000) -> float:
    """Queue ``n`` one-GPU jobs in batches; seconds it took."""
    spec = JobSpec(
        name="scale", workload=CommandWorkload(argv=["true"]), resources=Resources(gpus=1)
    )
    body = spec.model_dump_json()
    started = time.perf_counter()
    left = n
    while left > 0:
        k = min(batch, left)
        content = ('{"specs": [' + ", ".join([body] * k) + "]}").encode()
        r = await client.post("/jobs/batch", content=content, timeout=600)
        if r.status_code != 201:
            raise RuntimeError(f"batch submit refused: {r.status_code} {r.text[:300]}")
        left -= k
    return time.perf_counter() - started


async def one_count(args: argparse.Namespace, workers: int, tmp: Path) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    shared = Shared(ctx.Value("q", 0), ctx.Event(), ctx.Queue())
    serve_args: tuple[str, ...] = ()
    pg = None
    if args.db == "postgres":
        from gpulayer_kernel.testing.postgres import PostgresServer

        pg = PostgresServer(tmp / f"pg-{workers}").start()
        serve_args = ("--db", pg.create_database(f"scale{workers}"))
    home = tmp / f"home-{workers}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        with ServeProcess(home, heartbeat_timeout=120, args=serve_args, env=env) as server:
            join = server.create_token("join", ttl=3600)
            per = -(-workers // args.procs)
            for k in range(args.procs):
                n = min(per, workers - k * per)
                if n > 0:
                    a = (server.url, join, k * per, n, args.gpus, args.hold, shared, args.tunnel)
                    procs.append(ctx.Process(target=_workers_proc, args=a))
            for p in procs:
                p.start()
            t_join = time.perf_counter()
            while shared.joined.value < workers:
                if time.perf_counter() - t_join > 900:
                    raise TimeoutError(f"only {shared.joined.value}/{workers} workers joined")
                await asyncio.sleep(0.2)
            joined_in = time.perf_counter() - t_join
            headers = {
                "Authorization": f"Bearer {server.admin_token}",
                "Content-Type": "application/json",
                versions.HEADER: PROTOCOL,
            }
            limits = httpx.Limits(max_connections=4)
            async with httpx.AsyncClient(
                base_url=f"{server.url}/api/v1", headers=headers, limits=limits, timeout=60
            ) as client:
                queued_in = await submit_jobs(client, args.jobs)
                meter = TreeCpu({"server": server.pid})
                cpu0, t0 = meter.sample(), time.perf_counter()
                before = (await client.get("/metrics")).text
                passes0, _ = pass_seconds(before)
                spec = JobSpec(
                    name="probe",
                    workload=CommandWorkload(argv=["true"]),
                    resources=Resources(gpus=1),
                ).model_dump_json()
                submits: list[float] = []
                rss_peak = rss_mib(server.pid)
                deadline = time.perf_counter() + args.seconds
                while time.perf_counter() < deadline:
                    s = time.perf_counter()
                    r = await client.post("/jobs", content=spec)
                    submits.append(time.perf_counter() - s)
                    if r.status_code != 201:
                        raise RuntimeError(f"submit refused: {r.status_code} {r.text[:200]}")
                    rss_peak = max(rss_peak, rss_mib(server.pid))
                    await asyncio.sleep(args.gap)
                metrics = (await client.get("/metrics")).text
                cpu1, t1 = meter.sample(), time.perf_counter()
            shared.stop.set()  # the workers go before the server does
            for p in procs:
                p.join(60)
            passes1, pass_mean = pass_seconds(metrics)
            commits, commit_mean = histogram(metrics, "gpulayer_store_commit_seconds")
            replaced: list[float] = []
            while not shared.replaced.empty():
                replaced.append(shared.replaced.get())
            cpu_share = (cpu1["server"] - cpu0["server"]) / (t1 - t0)
            # The measured window's slow requests; the joins and the queueing before it apart.
            earlier = over_a_second(before)
            slow = {k: n - earlier.get(k, 0) for k, n in over_a_second(metrics).items()}
            slow = {k: n for k, n in slow.items() if n > 0}
            out = {
                "workers": workers,
                "joined_s": joined_in,
                "queue_s": queued_in,
                "submit_p50": pct(submits, 0.5) * 1000,
                "submit_p99": pct(submits, 0.99) * 1000,
                "place_p50": pct(replaced, 0.5) * 1000,
                "place_p99": pct(replaced, 0.99) * 1000,
                "pass_ms": pass_mean * 1000,
                "passes": passes1 - passes0,
                "rss_mib": rss_peak,
                "cpu": cpu_share,
                "over_1s": sum(slow.values()),
                "over_1s_before": sum(earlier.values()),
            }
            print(
                f"{workers:>5} workers × {args.gpus} GPUs, {args.jobs:,} queued: joined in "
                f"{joined_in:.1f}s, queued in {queued_in:.1f}s; submit p50 "
                f"{out['submit_p50']:.1f} ms p99 {out['submit_p99']:.1f} ms; a freed GPU placed "
                f"p50 {out['place_p50']:.0f} ms p99 {out['place_p99']:.0f} ms ({len(replaced)}); "
                f"pass {out['pass_ms']:.0f} ms ({out['passes']:.0f} passes); store commit "
                f"{commit_mean * 1000:.1f} ms ({commits:.0f}); server RSS "
                f"{rss_peak:.0f} MiB, CPU {cpu_share:.0%} of a core; requests over 1 s in the "
                f"window: {slow or 'none'} (while joining and queueing: {earlier or 'none'})",
                flush=True,
            )
            return out
    finally:
        shared.stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if pg is not None:
            pg.stop()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="500,5000", help="worker counts, comma-separated")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--procs", type=int, default=4, help="processes holding the workers")
    p.add_argument("--hold", type=float, default=120.0, help="seconds each job runs")
    p.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    p.add_argument("--gap", type=float, default=0.05, help="seconds between probe submits")
    p.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument(
        "--tunnel",
        action="store_true",
        help="the simulated workers send their requests on the worker tunnel (as `gpulayer "
        "worker` does by default), not each over HTTP",
    )
    args = p.parse_args()
    raise_fd_limit()
    print(
        f"machine: {describe()}; load {os.getloadavg()[0]:.2f}; store {args.db}; "
        f"workers on {'the tunnel' if args.tunnel else 'HTTP'}"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="gl-bench-scale-") as tmp:
        for n in (int(x) for x in args.workers.split(",")):
            results.append(await one_count(args, n, Path(tmp)))
    if len(results) > 1:
        a, b = results[0], results[-1]
        grow = b["workers"] / a["workers"]
        for key in ("submit_p99", "place_p99", "pass_ms", "rss_mib", "cpu"):
            ratio = b[key] / a[key] if a[key] else float("nan")
            print(f"  {key}: ×{ratio:.2f} for ×{grow:.0f} workers")
    last = results[-1]
    verdict = last["submit_p99"] <= 100 and last["rss_mib"] <= 1024 and not last["over_1s"]
    print(
        f"at {last['workers']} workers: submit p99 {last['submit_p99']:.0f} ms (<= 100), RSS "
        f"{last['rss_mib']:.0f} MiB (<= 1024), requests over 1 s {last['over_1s']:.0f} "
        f"(none): {'met' if verdict else 'missed'}; median placement "
        f"{statistics.median([r['place_p50'] for r in results]):.0f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
