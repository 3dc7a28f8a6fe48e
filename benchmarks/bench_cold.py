"""Cold start: a fresh process and a fresh ``$GPULAYER_HOME`` to the first result, beside Ray and
ipyparallel starting from nothing, in the same run.

    python benchmarks/bench_cold.py                 # 5 interleaved rounds, anchors included
    python benchmarks/bench_cold.py --rounds 9
    python benchmarks/bench_cold.py --quick         # one round, no anchors: the smoke test
    python benchmarks/bench_cold.py --against DIR   # also another checkout's package (before/after)

Each round starts, in an order that rotates from round to round:

* **gpulayer, Python API** (the figure; target ≤ 500 ms): a new interpreter runs
  ``open_session(local_worker=True)`` on a fresh ``$GPULAYER_HOME``, submits a cell job
  (``1 + 1``) and waits for its value — the embedded control plane on SQLite, its local worker
  and the probe of this machine all start inside that process, as for a user's first script;
* **gpulayer run** (the command line): ``gpulayer run -- true`` on a fresh home;
* **gpulayer, first start on this machine**: the same script with an empty per-machine probe
  cache (``$GPULAYER_CACHE_DIR``), as on a machine that never ran GPUlayer (or after a torch or
  driver upgrade): the full probe then runs in the background; the round waits for it to end
  before going on, so it does not slow the next measurement;
* **Ray** ``ray.init()`` (a local cluster, no dashboard) and the first ``ray.get(f.remote())``;
* **ipyparallel** ``Cluster(n=1)`` started, connected and the first ``apply_sync``;
* with ``--against DIR``: the Python API script again, importing the package from ``DIR`` (a
  checkout of another version, e.g. ``git worktree add /tmp/main main``), for a before/after.

Every time is measured from spawning the process to reading the result on its stdout (what the
user waits for); shutting down is not counted, for anyone. The per-machine cache is warmed once
before the rounds (a first start would otherwise pay it once, like any later one would not).
The last line is the Python API's median, with its ratio to each anchor (medians of per-round
ratios).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe

MARK = "COLD-RESULT"
CWD = "BENCH_COLD_CWD"

GPULAYER_SCRIPT = f"""
import asyncio
from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import JobSpec, PythonWorkload
from gpulayer_kernel.client.connect import open_session

async def main():
    digest, data = bundles.build({{"cell.py": b"1 + 1"}})
    async with open_session(local_worker=True) as s:
        await s.put_bundle(data, digest)
        work = PythonWorkload(bundle=digest, entrypoint="cell:cell.py")
        job = await s.submit(JobSpec(workload=work))
        done = await s.wait(job.id, timeout=120)
        while not done.state.terminal:
            done = await s.wait(job.id, timeout=120)
        print("{MARK}", done.state.value, done.result, flush=True)

asyncio.run(main())
"""

RAY_SCRIPT = f"""
import ray
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)

@ray.remote
def f():
    return 2

print("{MARK}", ray.get(f.remote()), flush=True)
ray.shutdown()
"""

IPP_SCRIPT = f"""
import ipyparallel as ipp
with ipp.Cluster(n=1, log_level=40) as rc:
    rc.wait_for_engines(1, timeout=120)
    print("{MARK}", rc[:].apply_sync(lambda: 2), flush=True)
"""


def until_result(argv: list[str], env: dict[str, str], timeout: float = 180.0) -> float:
    """Seconds from spawning ``argv`` to the result line on its stdout; waits for its exit.

    It runs in ``$BENCH_COLD_CWD`` (the run's scratch folder): ``python -c`` puts its working
    folder first on ``sys.path``, and a checkout's would shadow ``--against``."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, cwd=env[CWD]
    )
    assert proc.stdout is not None
    took: float | None = None
    for line in proc.stdout:
        if line.startswith(MARK):
            took = time.perf_counter() - start
            if " failed" in line or " None" in line:
                raise RuntimeError(f"{argv[-1][:40]!r}: {line.strip()}")
            break
    _, err = proc.communicate(timeout=timeout)
    if took is None or proc.returncode != 0:
        raise RuntimeError(
            f"no result from {' '.join(argv[:3])}: exit {proc.returncode}: {err[-2000:]}"
        )
    return took


def wait_for_background_probe(cache: Path, timeout: float = 180.0) -> None:
    """Until the per-machine cache has its entry and no probe holds a lock (it ended)."""
    import fcntl

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        locks = list(cache.glob("probe-*.lock"))
        if list(cache.glob("probe-*.json")) and locks:
            fd = os.open(locks[0], os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # returns when the probe process has ended
            finally:
                os.close(fd)
            return
        time.sleep(0.05)  # between rounds, never inside a measurement
    raise RuntimeError(f"the background probe left nothing in {cache} within {timeout:g}s")


class Runner:
    """The paths measured, each a callable returning seconds."""

    def __init__(self, work: Path, anchors: bool, against: Path | None = None) -> None:
        self.work = work
        self.cache = work / "machine-cache"
        self.base = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        self.base["GPULAYER_CACHE_DIR"] = str(self.cache)
        self.base[CWD] = str(work)
        self.n = 0
        self.paths: dict[str, Callable[[], float]] = {
            "gpulayer, Python API": self.api,
            "gpulayer run -- true": self.cli,
            "gpulayer, first start on this machine": self.first,
        }
        self.against = against
        if against is not None:
            self.paths[f"gpulayer from {against}, Python API"] = self.other
        if anchors:
            self.paths["Ray init + first task"] = self.ray
            self.paths["ipyparallel Cluster(n=1) + apply"] = self.ipp

    def env(self, **extra: str) -> dict[str, str]:
        self.n += 1
        home = self.work / f"home-{self.n}"
        return {**self.base, "GPULAYER_HOME": str(home), **extra}

    def api(self) -> float:
        return until_result([sys.executable, "-c", GPULAYER_SCRIPT], self.env())

    def cli(self) -> float:
        env = self.env()
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "gpulayer_kernel.cli", "run", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=self.work,
        )
        if done.returncode != 0:
            raise RuntimeError(f"gpulayer run failed: {done.stderr[-2000:]}")
        return time.perf_counter() - start

    def first(self) -> float:
        cache = self.work / f"cold-cache-{self.n}"
        took = until_result(
            [sys.executable, "-c", GPULAYER_SCRIPT], self.env(GPULAYER_CACHE_DIR=str(cache))
        )
        if importlib.util.find_spec("torch") is not None:
            wait_for_background_probe(cache)
        return took

    def other(self) -> float:
        env = self.env(PYTHONPATH=str(self.against))
        return until_result([sys.executable, "-c", GPULAYER_SCRIPT], env)

    def ray(self) -> float:
        env = {**self.base, "RAY_USAGE_STATS_ENABLED": "0"}
        return until_result([sys.executable, "-c", RAY_SCRIPT], env)

    def ipp(self) -> float:
        env = {**self.base, "IPYTHONDIR": str(self.work / "ipython")}
        return until_result([sys.executable, "-c", IPP_SCRIPT], env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one round, no anchors (smoke test)")
    parser.add_argument(
        "--against", type=Path, default=None, metavar="DIR", help="another package tree to time"
    )
    args = parser.parse_args(argv)
    anchors = not args.quick
    if anchors:
        missing = [m for m in ("ray", "ipyparallel") if importlib.util.find_spec(m) is None]
        if missing:
            parser.error(f"the anchors need {', '.join(missing)}: pip install -e '.[benchmark]'")
    rounds = 1 if args.quick else args.rounds
    print(f"machine: {describe()}; load average {os.getloadavg()[0]:.2f}")
    work = Path(tempfile.mkdtemp(prefix="gpulayer-bench-cold-"))
    try:
        run = Runner(work, anchors, args.against)
        run.api()  # warms the per-machine probe cache (and the OS's file cache) once
        wait_for_background_probe(run.cache) if importlib.util.find_spec("torch") else None
        names = list(run.paths)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(run.paths[name]())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ms = {name: statistics.median(t) * 1000 for name, t in times.items()}
    for name in names:
        spread = f"{min(times[name]) * 1000:.0f}-{max(times[name]) * 1000:.0f}"
        print(f"{name}: {ms[name]:.0f} ms (median of {rounds}; {spread} ms)")
    figure = "gpulayer, Python API"
    ratios = ""
    for name in names[3:]:
        if name.startswith("gpulayer from"):
            continue
        per_round = [a / b for a, b in zip(times[figure], times[name], strict=True)]
        ratios += f"; /{name.split()[0]} {statistics.median(per_round):.2f}"
    print(f"cold start, fresh $GPULAYER_HOME to first result: {ms[figure]:.0f} ms{ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
