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
    call, the bundle inline), served (the client and the worker on their tunnels; the same
    plane with the client over HTTP; a second served plane with everything over HTTP, its
    worker ``--no-tunnel``) and embedded, in the same rounds as the anchors:
    ipyparallel's ``apply_sync`` on one engine and a Ray task (``--no-anchors`` or ``--quick``
    skips them). Targets: served Python job <= 4 ms, embedded <= 2 ms.
(b) Throughput: jobs/s through submit -> assign -> started -> finished against ``gpulayer serve``
    in a subprocess, with no-op fake workers speaking HTTP through ``HttpTransport`` (one
    ``Reporter`` each: protocol 1.1's merged, batched reports) and submitters posting
    ``/jobs/batch`` (``--batch`` jobs a request, ``--inflight`` jobs in the system), both in
    *other processes* (spawned), so the server's CPU is measured alone. Printed: jobs/s, and
    CPU per job from /proc (``_cpu.py``: each process tree with what it reaped) for the server
    and the whole system (server, workers, submitters, this process). ``--variant NAME:VAR=V``
    runs the same harness with the server under another environment (``PYTHONPATH`` of an
    older tree, ``GPULAYER_LOOP=asyncio``), interleaved round by round (``--tp-rounds``), and
    prints the per-round ratio of server CPU per job. Then Ray's and ipyparallel's rate on
    1,000 tiny tasks in the same run, with their CPU per task (their processes + the driver).
    ``--profile-server`` runs (b) once with the server under cProfile (its main thread's CPU
    clock) and prints the top functions.

(a) also prints the whole-system CPU of one call of each way (the served Python job: server,
worker and its job processes, this process; Ray: its processes and the driver).

The last line is (b), e.g. ``throughput: 612 jobs/s (...); server CPU 0.9 ms a job``.
Targets on a 2-core machine (issue 25): server CPU <= 0.7 ms a job; >= 1,000 jobs/s;
whole-system CPU per job <= Ray's per task.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import multiprocessing.process
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from _cpu import TreeCpu, describe_cpu, self_cpu_seconds, wait_quiet  # benchmarks/_cpu.py
from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpulayer_kernel import bundles, versions  # noqa: E402
from gpulayer_kernel.client.clients import AsyncClient  # noqa: E402
from gpulayer_kernel.contracts import (  # noqa: E402
    PROTOCOL,
    CommandWorkload,
    FinishReport,
    JobFollow,
    JobSpec,
    JobState,
    PythonWorkload,
    WorkerRegistration,
)
from gpulayer_kernel.embedded import Embedded  # noqa: E402
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, processes  # noqa: E402
from gpulayer_kernel.worker.http import HttpTransport  # noqa: E402
from gpulayer_kernel.worker.reports import Reporter  # noqa: E402

TRIVIAL = [sys.executable, "-c", "print(1)"]
CELL_DIGEST, CELL_BUNDLE = bundles.build({"cell.py": b"print(1)\n1 + 1\n"})
CELL = JobSpec(name="cell", workload=PythonWorkload(bundle=CELL_DIGEST, entrypoint="cell:cell.py"))


def child_pids(pid: int) -> set[int]:
    """The direct children of ``pid`` now (to tell which processes a library just started)."""
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


class CallCpu:
    """CPU of named process trees around single calls, summed per way.

    This process's own CPU is read last before the call and first after it, so the /proc scans
    that sample the trees are not charged to the call.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def before(self, roots: dict[str, int]) -> tuple[float, float]:
        trees = TreeCpu(roots).sample()
        return sum(v for k, v in trees.items() if k != "self"), trees["self"]

    def after(self, way: str, roots: dict[str, int], at: tuple[float, float]) -> None:
        me = self_cpu_seconds()
        trees = sum(v for k, v in TreeCpu(roots).sample().items() if k != "self")
        self.seconds[way] = self.seconds.get(way, 0.0) + (trees - at[0]) + (me - at[1])
        self.calls[way] = self.calls.get(way, 0) + 1

    def per_call_ms(self, way: str) -> float:
        return 1000.0 * self.seconds.get(way, 0.0) / max(self.calls.get(way, 0), 1)


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
    """ipyparallel (one engine, ``apply_sync``) and Ray (a task), where installed.

    ``roots`` are the processes each started (this process's new children), for their CPU;
    ``bulk`` fires N tiny tasks at once and waits for them all (throughput).
    """

    def __init__(self) -> None:
        self.ways: dict[str, Callable[[], float]] = {}
        self.roots: dict[str, list[int]] = {}
        self.bulk: dict[str, tuple[Callable[[int], None], list[int]]] = {}
        self._stop: list[Callable[[], object]] = []

    def start(self) -> None:
        import importlib.util

        me = os.getpid()
        if importlib.util.find_spec("ipyparallel"):
            import ipyparallel as ipp

            had = child_pids(me)
            rc = ipp.Cluster(n=1, log_level=40).start_and_connect_sync()
            rc.wait_for_engines(1)
            view = rc[0]
            lview = rc.load_balanced_view()
            self._stop.append(rc.cluster.stop_cluster_sync)
            self.roots["ipyparallel"] = sorted(child_pids(me) - had)

            def ipp_call() -> float:
                t0 = time.perf_counter()
                assert view.apply_sync(_add, 1, 1) == 2
                return time.perf_counter() - t0

            def ipp_bulk(n: int) -> None:
                results = [lview.apply_async(_add, 1, 1) for _ in range(n)]
                assert all(r.get() == 2 for r in results)

            self.ways["ipyparallel"] = ipp_call
            self.bulk["ipyparallel"] = (ipp_bulk, self.roots["ipyparallel"])
        if importlib.util.find_spec("ray"):
            import ray

            had = child_pids(me)
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=40)
            self._stop.append(ray.shutdown)
            task = ray.remote(_add)

            def ray_call() -> float:
                t0 = time.perf_counter()
                assert ray.get(task.remote(1, 1)) == 2
                return time.perf_counter() - t0

            def ray_bulk(n: int) -> None:
                assert ray.get([task.remote(1, 1) for _ in range(n)]) == [2] * n

            ray_call()  # its worker processes exist after the first task
            self.roots["ray"] = sorted(child_pids(me) - had)
            self.ways["ray"] = ray_call
            self.bulk["ray"] = (ray_bulk, self.roots["ray"])

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


async def latency(rounds: int, tmp: Path, others: Anchors) -> None:
    spec = JobSpec(name="trivial", workload=CommandWorkload(argv=TRIVIAL))
    me = os.getpid()
    # A second served plane whose worker sends everything over HTTP (``--no-tunnel``): the
    # worker tunnel's gain, side by side (ADR 0003).
    with ServeProcess(tmp / "serve-home") as server, ServeProcess(tmp / "serve-h") as plain:
        join = server.create_token("join")
        worker = WorkerProcess(
            server.url, join, name="bench-w", simulate_gpus=1, home=tmp / "worker"
        )
        untunneled = WorkerProcess(
            plain.url,
            plain.create_token("join"),
            name="bench-h",
            simulate_gpus=1,
            home=tmp / "worker-h",
            args=("--no-tunnel",),
        )
        with worker, untunneled:
            had = child_pids(me)
            emb = Embedded(tmp / "embedded-home", local_worker=True, simulate_gpus=1)
            await emb.start()
            try:
                # http-py: the client and the worker on their tunnels; http-py-c: the same
                # plane, the client over HTTP (the client tunnel's gain); http-py-h: the plain
                # plane, everything over HTTP.
                async with (
                    AsyncClient(server.url, server.admin_token) as client,
                    AsyncClient(server.url, server.admin_token, tunnel=False) as http_client,
                    AsyncClient(plain.url, plain.admin_token, tunnel=False) as plain_client,
                ):
                    ways = {
                        "http": lambda: round_trip(client, spec),
                        "embedded": lambda: round_trip(emb.cp, spec),
                        "http-py": lambda: python_trip(client),
                        "http-py-c": lambda: python_trip(http_client),
                        "http-py-h": lambda: python_trip(plain_client),
                        "embedded-py": lambda: python_trip(emb.cp),
                    }
                    # Whose CPU each way spends, besides this process's own: the server and
                    # the worker with its job processes; the embedded host's children (its
                    # zygote and jobs); the anchors' own processes.
                    roots: dict[str, dict[str, int]] = {
                        "http-py": {"server": server.pid, "worker": worker.pid},
                        "http-py-c": {"server": server.pid, "worker": worker.pid},
                        "http-py-h": {"server": plain.pid, "worker": untunneled.pid},
                    }
                    for name, pids in others.roots.items():
                        roots[name] = {f"{name}{p}": p for p in pids}
                    meter = CallCpu()

                    async def one(name: str) -> float:
                        if name == "bare":
                            return bare()
                        if name in others.ways:
                            return others.ways[name]()
                        return await ways[name]()

                    async def measured(name: str) -> float:
                        if name not in roots:
                            return await one(name)
                        at = meter.before(roots[name])
                        took = await one(name)
                        meter.after(name, roots[name], at)
                        return took

                    order = [*ways, "bare", *others.ways]
                    for _ in range(5):  # warm-up: imports, caches, connections
                        for name in order:
                            await one(name)
                    # The embedded host's children, once the warm-up has started them all.
                    roots["embedded-py"] = {f"c{p}": p for p in child_pids(me) - had}
                    # Each worker's zygotes (one imports torch, ~2 s of a core) are up before
                    # the first measured round, or their start is measured with it.
                    waited = wait_quiet(
                        {"w": worker.pid, "h": untunneled.pid, **roots["embedded-py"]}
                    )
                    print(f"(a) waited {waited:.1f} s for the workers' zygotes to settle")
                    times: dict[str, list[float]] = {name: [] for name in order}
                    for i in range(rounds):
                        k = i % len(order)
                        for name in order[k:] + order[:k]:
                            times[name].append(await measured(name))
            finally:
                await emb.stop()
    ms = {k: [1000 * v for v in vs] for k, vs in times.items()}
    for name in ("bare", "embedded", "http", "embedded-py", "http-py", "http-py-c", "http-py-h"):
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
    for other, words in (
        ("http-py-c", "client tunnel / client over HTTP"),
        ("http-py-h", "both tunnels / HTTP only"),
    ):
        ratios = [a / b for a, b in zip(times["http-py"], times[other], strict=True)]
        print(
            f"(a) served Python job, {words}: {statistics.median(ratios):.2f}x  ({spread(ratios)})"
        )
    for anchor in (n for n in ("ipyparallel", "ray") if n in times):
        print(f"(a) {anchor} anchor: median {statistics.median(ms[anchor]):.2f} ms")
        for name in ("embedded-py", "http-py"):
            ratios = [a / b for a, b in zip(times[name], times[anchor], strict=True)]
            print(f"(a) {name}/{anchor}: {statistics.median(ratios):.2f}x  ({spread(ratios)})")
    print(
        "(a) whole-system CPU per call (the processes each way uses + this one): "
        + ", ".join(f"{w} {meter.per_call_ms(w):.2f} ms" for w in roots if meter.calls.get(w))
    )
    if meter.calls.get("ray"):
        ratio = meter.per_call_ms("http-py") / max(meter.per_call_ms("ray"), 1e-6)
        print(f"(a) served Python job CPU / Ray task CPU: {ratio:.2f}x (target <= 1.0)")


# -- (b) throughput: fake workers and submitters in processes of their own --------------------
#
# The server's CPU is measured alone only when nothing else the benchmark runs shares its
# process or this one: the fake workers and the submitters run in a pool of other processes
# (spawned: a fork of this process would carry its event loop and Ray's threads), and this
# process only samples /proc.


class Shared(NamedTuple):
    """What the harness's processes share: jobs done, room in flight, start and stop."""

    done: Any  # multiprocessing.Value("q")
    slots: Any  # multiprocessing.Semaphore: one per batch of jobs that may be in flight
    batch: int
    ready: Any  # submitters connected and waiting for ``go``
    go: Any  # multiprocessing.Event
    stop: Any
    tunnel: bool  # the fake workers send on the worker tunnel (``--tunnel``), as real ones do


def _worker_proc(url: str, join: str, first: int, count: int, shared: Shared) -> None:
    asyncio.run(_fake_workers(url, join, first, count, shared))


async def _fake_workers(url: str, join: str, first: int, count: int, shared: Shared) -> None:
    stop = asyncio.Event()

    async def watch() -> None:
        while not shared.stop.is_set():
            await asyncio.sleep(0.05)
        stop.set()

    watcher = asyncio.create_task(watch())
    await asyncio.gather(*(fake_worker(url, join, first + i, shared, stop) for i in range(count)))
    watcher.cancel()


async def fake_worker(url: str, join: str, i: int, shared: Shared, stop: asyncio.Event) -> None:
    t = HttpTransport(url, join, tunnel=shared.tunnel)
    # As the agent reports (protocol 1.1): a short job's start and end in one entry, the
    # entries of every job ending meanwhile in one request.
    reporter = Reporter(t.report)
    done = shared.done

    async def run(job_id: str, attempt: int | None) -> None:
        reporter.started(job_id, attempt)
        await reporter.finished(job_id, attempt, FinishReport(state="succeeded", exit_code=0))
        with done.get_lock():
            done.value += 1
            if done.value % shared.batch == 0:
                shared.slots.release()  # a batch's worth done: room for another

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


def _submitter_proc(url: str, token: str, inflight: int, batch: int, shared: Shared) -> None:
    asyncio.run(_submitter(url, token, inflight, batch, shared))


async def _submitter(url: str, token: str, inflight: int, batch: int, shared: Shared) -> None:
    """Keeps ``inflight`` jobs (all submitters together) in the system, ``batch`` a request.

    It posts ``/jobs/batch`` with httpx and reads only the status and the refusals: parsing
    every job of the answer would cost this process more than the server spends on it.
    """
    import httpx

    spec = JobSpec(name="noop", workload=CommandWorkload(argv=["true"]))
    body = ('{"specs": [' + ", ".join([spec.model_dump_json()] * batch) + "]}").encode()
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        versions.HEADER: PROTOCOL,
    }
    async with httpx.AsyncClient(base_url=f"{url}/api/v1", headers=headers) as client:
        (await client.get("/workers")).raise_for_status()  # connected: wait for the start
        with shared.ready.get_lock():
            shared.ready.value += 1
        while not shared.go.wait(0.05):
            if shared.stop.is_set():
                return
        while not shared.stop.is_set():
            if not await asyncio.to_thread(shared.slots.acquire, True, 0.1):
                continue
            answer = await client.post("/jobs/batch", content=body)
            if answer.status_code != 201 or b'"refused":[]' not in answer.content:
                raise RuntimeError(f"submit refused: {answer.status_code} {answer.text[:300]}")


def _children_of(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split()}


async def throughput(
    seconds: float,
    workers: int,
    inflight: int,
    tmp: Path,
    *,
    submitters: int = 2,
    worker_procs: int = 2,
    batch: int = 32,
    serve_args: tuple[str, ...] = (),
    serve_env: dict[str, str] | None = None,
    label: str = "",
    tunnel: bool = False,
) -> tuple[float, dict[str, float]]:
    """Jobs/s and CPU ms per job (server, workers, submitters, this process, total)."""
    ctx = multiprocessing.get_context("spawn")
    shared = Shared(
        ctx.Value("q", 0),
        ctx.Semaphore(max(1, inflight // batch)),
        batch,
        ctx.Value("q", 0),
        ctx.Event(),
        ctx.Event(),
        tunnel,
    )
    home = tmp / f"tp-home-{label or 'default'}-{time.monotonic_ns()}"
    with ServeProcess(home, heartbeat_timeout=120, args=serve_args, env=serve_env) as server:
        join = server.create_token("join")
        per = -(-workers // worker_procs)
        procs: dict[str, list[multiprocessing.process.BaseProcess]] = {
            "workers": [],
            "submitters": [],
        }
        for k in range(worker_procs):
            n = min(per, workers - k * per)
            if n > 0:
                args = (server.url, join, k * per, n, shared)
                procs["workers"].append(ctx.Process(target=_worker_proc, args=args))
        for p in procs["workers"]:
            p.start()
        try:
            async with AsyncClient(server.url, server.admin_token) as client:
                while len(await client.workers()) < workers:
                    await asyncio.sleep(0.05)
            for _ in range(submitters):
                args = (server.url, server.admin_token, inflight, batch, shared)
                procs["submitters"].append(ctx.Process(target=_submitter_proc, args=args))
            for p in procs["submitters"]:
                p.start()
            while shared.ready.value < submitters:
                await asyncio.sleep(0.05)
            shared.go.set()
            await asyncio.sleep(min(1.0, seconds / 2))  # warm-up
            roots = {"server": server.pid}
            roots |= {f"worker{i}": p.pid or 0 for i, p in enumerate(procs["workers"])}
            roots |= {f"submitter{i}": p.pid or 0 for i, p in enumerate(procs["submitters"])}
            meter = TreeCpu(roots)
            n0, cpu0, t0 = shared.done.value, meter.sample(), time.perf_counter()
            await asyncio.sleep(seconds)
            n1, cpu1, t1 = shared.done.value, meter.sample(), time.perf_counter()
        finally:
            shared.stop.set()
            for group in procs.values():
                for p in group:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
    n = n1 - n0
    per_job = TreeCpu.per_unit(cpu0, cpu1, n)
    cpu = {
        "server": per_job["server"],
        "workers": sum(v for k, v in per_job.items() if k.startswith("worker")),
        "submitters": sum(v for k, v in per_job.items() if k.startswith("submitter")),
        "self": per_job["self"],
    }
    cpu["total"] = sum(cpu.values())
    rate = n / (t1 - t0)
    print(
        f"(b){label} {n} jobs in {t1 - t0:.2f}s: {rate:.0f} jobs/s; {workers} no-op "
        f"{'tunnelled' if tunnel else 'HTTP'} workers in {len(procs['workers'])} processes, "
        f"{submitters} submitter processes ({batch} a "
        f"batch, {inflight} in flight)"
    )
    print(
        f"(b){label} CPU per job: server {cpu['server']:.3f} ms (one core serves "
        f"~{1000 / max(cpu['server'], 1e-3):.0f} jobs/s); whole system: " + describe_cpu(cpu)
    )
    return rate, cpu


def anchor_throughput(anchors: Anchors, tasks: int = 1000) -> dict[str, float]:
    """Ray's and ipyparallel's rate on ``tasks`` tiny tasks, and their CPU per task."""
    rates: dict[str, float] = {}
    for name, (fire, roots) in anchors.bulk.items():
        fire(50)  # warm-up
        meter = TreeCpu({f"{name}{i}": pid for i, pid in enumerate(roots)})
        c0, t0 = meter.sample(), time.perf_counter()
        fire(tasks)
        t1, c1 = time.perf_counter(), meter.sample()
        per = TreeCpu.per_unit(c0, c1, tasks)
        rates[name] = tasks / (t1 - t0)
        print(
            f"(b) {name}: {tasks} tiny tasks in {t1 - t0:.2f}s: {rates[name]:.0f} tasks/s; "
            f"CPU per task {per['total']:.3f} ms (its processes + the driver)"
        )
    return rates


def _variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:VAR=VALUE,VAR=VALUE`` -> (name, env); e.g. ``before:PYTHONPATH=/tmp/wt``."""
    name, _, assigns = text.partition(":")
    env = dict(a.split("=", 1) for a in assigns.split(",") if a)
    return name, env


# The server under cProfile on its main thread's CPU clock (wall time on a loaded machine
# would charge the other processes' turns to whatever the server was doing).
_PROFILED = """
import cProfile, sys, time
from gpulayer_kernel.cli.main import main
prof = cProfile.Profile(time.thread_time)
sys.argv[0] = "gpulayer"
try:
    prof.runcall(main)
finally:
    prof.dump_stats({out!r})
"""


def _profile_report(path: Path, top: int = 30) -> None:
    import pstats

    for key in ("tottime", "cumulative"):
        print(f"(profile) the server's main thread, top {top} by {key}:")
        pstats.Stats(str(path)).sort_stats(key).print_stats(top)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="latency rounds (default 30)")
    p.add_argument("--seconds", type=float, default=5.0, help="throughput window (default 5)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--batch", type=int, default=32, help="jobs per submit request (default 32)")
    p.add_argument("--submitters", type=int, default=2, help="submitter processes (default 2)")
    p.add_argument("--worker-procs", type=int, default=2, help="fake worker processes")
    p.add_argument("--tp-rounds", type=int, default=1, help="throughput rounds (default 1)")
    p.add_argument("--quick", action="store_true", help="a smoke run for CI (no anchors)")
    p.add_argument("--no-anchors", action="store_true", help="skip ipyparallel and Ray")
    p.add_argument("--no-latency", action="store_true", help="throughput only")
    p.add_argument(
        "--tunnel",
        action="store_true",
        help="(b)'s fake workers send on the worker tunnel, as `gpulayer worker` does (default: "
        "each request over HTTP, as the figures before the tunnel were taken)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE,...",
        help="also run throughput with the server under this environment (e.g. "
        "before:PYTHONPATH=/tmp/old-tree), interleaved round by round with the default",
    )
    p.add_argument(
        "--profile-server",
        action="store_true",
        help="run (b) once with the server under cProfile and print its top functions",
    )
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 3, 1.0
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_HOME"):
        os.environ.pop(var, None)
    print(f"machine: {describe()}")
    anchors = Anchors()
    with tempfile.TemporaryDirectory(prefix="gl-bench-http-") as d:
        tmp = Path(d)
        os.environ["GPULAYER_HOME"] = str(tmp / "default-home")
        tp = functools.partial(
            throughput,
            args.seconds,
            args.workers,
            args.inflight,
            tmp,
            submitters=args.submitters,
            worker_procs=args.worker_procs,
            batch=args.batch,
            tunnel=args.tunnel,
        )
        if args.profile_server:
            prof = tmp / "serve.prof"
            saved = processes.GL
            processes.GL = [sys.executable, "-c", _PROFILED.format(out=str(prof))]
            try:
                await tp(label=" [cProfile]")
            finally:
                processes.GL = saved
            _profile_report(prof)
            kept = Path(tempfile.gettempdir()) / "bench_http-serve.prof"
            shutil.copy(prof, kept)
            print(f"(profile) kept in {kept} (python -m pstats {kept})")
            return
        try:
            if not (args.quick or args.no_anchors):
                try:
                    anchors.start()
                except Exception as exc:  # e.g. Ray's node timing out on a loaded machine
                    print(f"(anchors) not all started: {type(exc).__name__}: {exc}")
            if not args.no_latency:
                await latency(args.rounds, tmp, anchors)
            variants = [("", {}), *(_variant(v) for v in args.variant)]
            got: dict[str, list[tuple[float, dict[str, float]]]] = {n: [] for n, _ in variants}
            for r in range(args.tp_rounds):
                k = r % len(variants)
                for name, env in variants[k:] + variants[:k]:
                    got[name].append(await tp(label=f" [{name}]" if name else "", serve_env=env))
            rates = anchor_throughput(anchors)
        finally:
            anchors.stop()
    rate = statistics.median(r for r, _ in got[""])
    server = statistics.median(c["server"] for _, c in got[""])
    whole = statistics.median(c["total"] for _, c in got[""])
    for name in got:
        if name:
            cpu = [
                b["server"] / a["server"] for (_, a), (_, b) in zip(got[""], got[name], strict=True)
            ]
            rr = [b / a for (a, _), (b, _) in zip(got[""], got[name], strict=True)]
            print(
                f"(b) [{name}] / this tree: server CPU per job {statistics.median(cpu):.2f}x "
                f"({spread(cpu)}), throughput {statistics.median(rr):.2f}x"
            )
    for name, other in rates.items():
        print(f"(b) GPUlayer / {name} throughput: {rate / other:.2f}x")
    print(
        f"throughput: {rate:.0f} jobs/s ({args.workers} workers, no-op executor); server CPU "
        f"{server:.3f} ms a job (target <= 0.7), whole system {whole:.2f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
