"""Where a command job's milliseconds go: a timeline of one job through the embedded path.

    .venv/bin/python benchmarks/trace_job.py [--jobs 40] [--python | --torch]

Runs ``python -c "import time; print(time.time())"`` as a command job (``--python``: the cell
``import time; time.time()`` as a Python job; ``--torch``: a cell that imports torch and sums a
tensor, as bench_cell.py's torch cell, then prints the time again) through an embedded control
plane and its worker, ``--jobs`` times after a warm-up, and stamps each step with
``time.time()`` (one clock for every process): submitted, the assignment at the worker, the
job's directory and environment ready, the launch answered (pid), the job's first line of its
own code (what it prints), its line at the worker, its exit seen by the worker, the executor's
report, the end in the caller's hands.
Beside it, the bare ``subprocess.run`` of the same command: spawn → first line → exit. Prints the
median of each step's time since the submit, and the load. The method behind the profile
in docs/performance.md (issue 35).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

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
from gpulayer_kernel.worker import executor as executor_mod
from gpulayer_kernel.worker import logship
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig, JobExecutor
from gpulayer_kernel.worker.transport import InProcessTransport

ARGV = [sys.executable, "-c", "import time; print(time.time())"]
CELLS = {
    "python": b"import time\nprint(time.time())\n1\n",
    "torch": b"import time\nprint(time.time())\nimport torch\nfloat(torch.ones(4).sum())\n"
    b"print(time.time())\n",
}

stamps: dict[str, float] = {}


def stamp(name: str) -> None:
    stamps.setdefault(name, time.time())


def instrument() -> None:
    """Wrap the worker's steps with stamps (first call of each per job)."""
    agent_start = WorkerAgent._start_job

    def start_job(self: WorkerAgent, a: Any) -> None:
        stamp("assigned at the worker")
        agent_start(self, a)

    WorkerAgent._start_job = start_job  # type: ignore[method-assign]

    prepare = JobExecutor._prepare

    async def _prepare(self: JobExecutor) -> Any:
        out = await prepare(self)
        stamp("directory and env ready")
        return out

    JobExecutor._prepare = _prepare  # type: ignore[method-assign]

    spawn = JobExecutor._spawn

    async def _spawn(self: JobExecutor, *a: Any) -> Any:
        out = await spawn(self, *a)
        stamp("launch answered (pid)")
        return out

    JobExecutor._spawn = _spawn  # type: ignore[method-assign]

    exited = executor_mod.main_exited

    async def main_exited(proc: Any) -> None:
        await exited(proc)
        stamp("exit seen by the worker")

    executor_mod.main_exited = main_exited

    pump = logship.pump_stream

    async def pump_stream(stream: Any, name: Any, shipper: Any, *a: Any) -> None:
        class Tap:
            def __getattr__(self, k: str) -> Any:
                return getattr(shipper, k)

            def add(self, *args: Any, **kw: Any) -> None:
                stamp("line at the worker")
                shipper.add(*args, **kw)

        await pump(stream, name, Tap(), *a)

    executor_mod.pump_stream = pump_stream  # type: ignore[assignment]

    run = JobExecutor.run

    async def run_(self: JobExecutor) -> Any:
        out = await run(self)
        stamp("executor's report")
        return out

    JobExecutor.run = run_  # type: ignore[method-assign]


async def one(cp: ControlPlane, cell: bytes | None) -> tuple[dict[str, float], float]:
    stamps.clear()
    start = time.time()
    if cell is not None:
        digest, bundle = bundles.build({"cell.py": cell})
        spec = JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py"))
        page = await cp.run(spec, bundle, wait=60)
        lines = [r.text for r in page.records]
        while not page.job.state.terminal or page.more:
            page = await cp.follow(page.job.id, since=page.next_since, cursor=page.cursor, wait=60)
            lines += [r.text for r in page.records]
        job = page.job
    else:
        job = await cp.submit(JobSpec(workload=CommandWorkload(argv=ARGV)))
        stamp("submitted")
        job = await cp.wait(job.id)
        lines = [r.text for r in (await cp.logs(job.id)).records if r.stream == "stdout"]
    end = time.time()
    assert job.state == JobState.SUCCEEDED, job
    times = [float(t) for t in lines if t.replace(".", "", 1).isdigit()]
    assert times, lines
    stamps["job's own first line"] = times[0]
    if len(times) > 1:
        stamps["job's own last line"] = times[-1]
    stamps["end in the caller's hands"] = end
    return dict(stamps), start


def bare() -> tuple[float, float, float]:
    start = time.time()
    out = subprocess.run(ARGV, check=True, capture_output=True, text=True)
    return start, float(out.stdout), time.time()


async def main(jobs: int, what: str) -> None:
    cell = CELLS.get(what)
    print(f"machine: {describe()}; load {open('/proc/loadavg').read().split()[:3]}")
    instrument()
    with tempfile.TemporaryDirectory() as d:
        store = SqliteStore(Path(d) / "db")
        await store.open()
        cp = ControlPlane(store, LocalArtifactStore(Path(d) / "a"))
        await cp.start()
        agent = WorkerAgent(
            InProcessTransport(cp),
            WorkerRegistration(name="trace", capabilities=WorkerCapabilities()),
            ExecutorConfig(work_root=Path(d) / "work"),
        )
        await agent.start()
        for _ in range(5):
            await one(cp, cell)
            bare()
        steps: dict[str, list[float]] = defaultdict(list)
        totals, bares, bare_first = [], [], []
        for _ in range(jobs):
            got, start = await one(cp, cell)
            for name, t in got.items():
                steps[name].append((t - start) * 1000)
            totals.append((got["end in the caller's hands"] - start) * 1000)
            b0, b1, b2 = bare()
            bares.append((b2 - b0) * 1000)
            bare_first.append((b1 - b0) * 1000)
            await asyncio.sleep(0.15)  # the spare's replacement, off the next job's path
        await agent.stop()
        await cp.close()
        await store.close()
    print(f"{what} job, {jobs} jobs: median ms since the submit (and since the step before)")
    prev = 0.0
    for name, xs in sorted(steps.items(), key=lambda kv: statistics.median(kv[1])):
        at = statistics.median(xs)
        print(f"  {name:32s} {at:7.2f}  (+{at - prev:.2f})")
        prev = at
    print(f"  {'total':32s} {statistics.median(totals):7.2f}")
    print(
        f"bare subprocess.run: first line {statistics.median(bare_first):.2f}, "
        f"total {statistics.median(bares):.2f}"
    )
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=40)
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--python", action="store_const", const="python", dest="what")
    kind.add_argument("--torch", action="store_const", const="torch", dest="what")
    a = p.parse_args()
    asyncio.run(main(a.jobs, a.what or "command"))
