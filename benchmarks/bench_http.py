"""The HTTP path: a trivial job's round trip, and control-plane throughput with no-op workers.

    .venv/bin/python benchmarks/bench_http.py [--rounds N] [--seconds S] [--quick]

(a) Round trip of ``python -c "print(1)"`` from submit to its output in hand, three ways, in
    interleaved rounds (the order rotates each round), after a warm-up:
      * http:     ``gpulayer serve`` (subprocess) + one ``gpulayer worker`` (subprocess); this
                  process submits with ``AsyncClient``, waits for the end, reads the log page;
      * embedded: an in-process ``Embedded`` (ControlPlane + local worker), the same calls;
      * bare:     ``subprocess.run([python, "-c", "print(1)"])``.
    Prints medians and the median of the per-round ratios (http/bare, embedded/bare).
    Then a trivial *Python* job (a cell ``print(1); 1 + 1``: its result and its log line in
    hand), the way a script calls GPUlayer with protocol 1.1 (``run``: submit and follow in one
    call, the bundle inline), served and embedded, in the same rounds as the anchors:
    ipyparallel's ``apply_sync`` on one engine and a Ray task (``--no-anchors`` or ``--quick``
    skips them). Targets: served Python job <= 4 ms, embedded <= 2 ms.
(b) Throughput: jobs/s through submit -> assign -> started -> finished, with 8 fake workers in
    this process speaking HTTP through ``HttpTransport`` whose "executor" reports started and
    finished at once, as the agent does (one ``Reporter``: protocol 1.1's merged, batched
    reports); this measures the control plane and the protocol, not process spawns,
    against ``gpulayer serve`` in a subprocess; submissions keep ``--inflight`` jobs in flight.

The last line is (b), e.g. ``throughput: 612 jobs/s (8 workers, no-op executor)``.
Targets on a 2-core machine: (a) http <= 1.5x bare; (b) >= 1,000 jobs/s (issue 14).
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
from collections.abc import Callable
from pathlib import Path

from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpulayer_kernel import bundles  # noqa: E402
from gpulayer_kernel.client import AsyncClient  # noqa: E402
from gpulayer_kernel.contracts import (  # noqa: E402
    CommandWorkload,
    FinishReport,
    JobFollow,
    JobSpec,
    JobState,
    PythonWorkload,
    WorkerRegistration,
)
from gpulayer_kernel.embedded import Embedded  # noqa: E402
from gpulayer_kernel.testing import ServeProcess, WorkerProcess  # noqa: E402
from gpulayer_kernel.worker.http import HttpTransport  # noqa: E402
from gpulayer_kernel.worker.reports import Reporter  # noqa: E402

TRIVIAL = [sys.executable, "-c", "print(1)"]
CELL_DIGEST, CELL_BUNDLE = bundles.build({"cell.py": b"print(1)\n1 + 1\n"})
CELL = JobSpec(name="cell", workload=PythonWorkload(bundle=CELL_DIGEST, entrypoint="cell:cell.py"))


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


async def python_trip(session: object) -> float:
    """A Python job's result and log line in hand, protocol 1.1: one ``run`` (the bundle inline),
    then the follow stream only if it outlived the run's answer."""
    t0 = time.perf_counter()
    page: JobFollow = await session.run(CELL, CELL_BUNDLE, wait=60)  # type: ignore[attr-defined]
    records = list(page.records)
    while not page.job.state.terminal or page.more:
        page = await session.follow(  # type: ignore[attr-defined]
            page.job.id, since=page.next_since, cursor=page.cursor, wait=60
        )
        records += page.records
    elapsed = time.perf_counter() - t0
    job = page.job
    if job.state != JobState.SUCCEEDED or job.result != 2 or "1" not in [r.text for r in records]:
        raise RuntimeError(f"job {job.id} ended {job.state}: {job.reason} ({job.result!r})")
    return elapsed


class Anchors:
    """ipyparallel (one engine, ``apply_sync``) and Ray (a task), where installed."""

    def __init__(self) -> None:
        self.ways: dict[str, Callable[[], float]] = {}
        self._stop: list[Callable[[], object]] = []

    def start(self) -> None:
        import importlib.util

        if importlib.util.find_spec("ipyparallel"):
            import ipyparallel as ipp

            rc = ipp.Cluster(n=1, log_level=40).start_and_connect_sync()
            rc.wait_for_engines(1)
            view = rc[0]
            self._stop.append(rc.cluster.stop_cluster_sync)

            def ipp_call() -> float:
                t0 = time.perf_counter()
                assert view.apply_sync(_add, 1, 1) == 2
                return time.perf_counter() - t0

            self.ways["ipyparallel"] = ipp_call
        if importlib.util.find_spec("ray"):
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=40)
            self._stop.append(ray.shutdown)
            task = ray.remote(_add)

            def ray_call() -> float:
                t0 = time.perf_counter()
                assert ray.get(task.remote(1, 1)) == 2
                return time.perf_counter() - t0

            self.ways["ray"] = ray_call

    def stop(self) -> None:
        for stop in reversed(self._stop):
            try:
                stop()
            except Exception as exc:  # the figures are printed; say what did not stop
                print(f"(anchors) stopping failed: {exc}", file=sys.stderr)


def _add(a: int, b: int) -> int:
    return a + b


def bare() -> float:
    t0 = time.perf_counter()
    out = subprocess.run(TRIVIAL, capture_output=True, text=True, check=True).stdout
    elapsed = time.perf_counter() - t0
    assert out == "1\n"
    return elapsed


async def latency(rounds: int, tmp: Path, anchors: bool) -> None:
    spec = JobSpec(name="trivial", workload=CommandWorkload(argv=TRIVIAL))
    with ServeProcess(tmp / "serve-home") as server:
        join = server.create_token("join")
        with WorkerProcess(server.url, join, name="bench-w", simulate_gpus=1, home=tmp / "worker"):
            emb = Embedded(tmp / "embedded-home", local_worker=True, simulate_gpus=1)
            await emb.start()
            others = Anchors()
            try:
                if anchors:
                    others.start()
                async with AsyncClient(server.url, server.admin_token) as client:
                    ways = {
                        "http": lambda: round_trip(client, spec),
                        "embedded": lambda: round_trip(emb.cp, spec),
                        "http-py": lambda: python_trip(client),
                        "embedded-py": lambda: python_trip(emb.cp),
                    }

                    async def one(name: str) -> float:
                        if name == "bare":
                            return bare()
                        if name in others.ways:
                            return others.ways[name]()
                        return await ways[name]()

                    order = [*ways, "bare", *others.ways]
                    for _ in range(5):  # warm-up: imports, caches, connections
                        for name in order:
                            await one(name)
                    times: dict[str, list[float]] = {name: [] for name in order}
                    for i in range(rounds):
                        k = i % len(order)
                        for name in order[k:] + order[:k]:
                            times[name].append(await one(name))
            finally:
                others.stop()
                await emb.stop()
    ms = {k: [1000 * v for v in vs] for k, vs in times.items()}
    for name in ("bare", "embedded", "http", "embedded-py", "http-py"):
        print(
            f"(a) {name:<9} median {statistics.median(ms[name]):6.1f} ms  "
            f"({spread(ms[name])} ms, {rounds} rounds)"
        )
    for name in ("embedded", "http"):
        ratios = [a / b for a, b in zip(times[name], times["bare"], strict=True)]
        print(f"(a) {name}/bare: {statistics.median(ratios):.2f}x  ({spread(ratios)})")
    for name, target in (("embedded-py", 2.0), ("http-py", 4.0)):
        p50 = statistics.median(ms[name])
        met = "met" if p50 <= target else "MISSED"
        print(
            f"(a) Python job, {name.removesuffix('-py')}: median {p50:.2f} ms "
            f"({spread(ms[name])} ms; target <= {target:g} ms: {met})"
        )
    for anchor in (n for n in ("ipyparallel", "ray") if n in times):
        print(f"(a) {anchor} anchor: median {statistics.median(ms[anchor]):.2f} ms")
        for name in ("embedded-py", "http-py"):
            ratios = [a / b for a, b in zip(times[name], times[anchor], strict=True)]
            print(f"(a) {name}/{anchor}: {statistics.median(ratios):.2f}x  ({spread(ratios)})")


async def fake_worker(
    url: str, join: str, i: int, done: asyncio.Queue[str], stop: asyncio.Event
) -> None:
    t = HttpTransport(url, join)
    # As the agent reports (protocol 1.1): a short job's start and end in one entry, the
    # entries of every job ending meanwhile in one request.
    reporter = Reporter(t.report)

    async def run(job_id: str, attempt: int | None) -> None:
        reporter.started(job_id, attempt)
        await reporter.finished(job_id, attempt, FinishReport(state="succeeded", exit_code=0))
        done.put_nowait(job_id)

    running: set[asyncio.Task[None]] = set()
    try:
        await t.register(WorkerRegistration(name=f"fake-{i}"))
        while not stop.is_set():
            work = await t.next_work(0.5)
            for a in work.assignments:  # like the agent: each job its own task
                task = asyncio.create_task(run(a.job.id, a.attempt))
                running.add(task)
                task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await reporter.close()
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
    p.add_argument("--quick", action="store_true", help="a smoke run for CI (no anchors)")
    p.add_argument("--no-anchors", action="store_true", help="skip ipyparallel and Ray")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 3, 1.0
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_HOME"):
        os.environ.pop(var, None)
    print(f"machine: {describe()}")
    with tempfile.TemporaryDirectory(prefix="gl-bench-http-") as d:
        tmp = Path(d)
        os.environ["GPULAYER_HOME"] = str(tmp / "default-home")
        await latency(args.rounds, tmp, anchors=not (args.quick or args.no_anchors))
        rate = await throughput(args.seconds, args.workers, args.inflight, tmp)
    print(f"throughput: {rate:.0f} jobs/s ({args.workers} workers, no-op executor)")


if __name__ == "__main__":
    asyncio.run(main())
