"""How long a gang job takes to get every rank running, against ``torchrun`` run by hand.

    .venv/bin/python benchmarks/bench_distributed.py [--rounds N] [--quick]

One script, three ways, interleaved round by round (the order rotates each round):

* torchrun: ``python -m torch.distributed.run --nproc-per-node 2 SCRIPT`` as a subprocess;
* gang, one worker: a 2-GPU job (simulated GPUs) submitted to an in-process ControlPlane with one
  worker: placement, job directory, torchrun with a static rendezvous, rank shim, log shipping;
* gang, 2 workers x 1 rank: the same with ``--nodes 2 --gpus 1`` on two workers (the rank-0
  worker publishes the rendezvous, the other long-polls for it).

Each rank's first act is to print ``time.time()``; the time to "every rank running" is the
latest of those stamps minus the moment of submit (or of spawning torchrun). Both sides pay
torchrun's own ``import torch`` (~2 s on a small machine) before any rank starts: like for like.
Then each rank imports torch and runs a gloo ``all_reduce`` of ``rank + 1``, checking the sum (not
timed; in ``--quick`` mode the ranks stop after their first line).

The LAST line is the ratio of medians, one-worker gang / direct torchrun, e.g.
``gang/torchrun: 1.04x``. Target: <= 1.3x.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCRIPT = """\
import time
print(f"GLSTART {time.time():.6f}", flush=True)
import os, sys
if os.environ.get("BENCH_COLLECTIVE", "1") == "1":
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    n = dist.get_world_size()
    dist.destroy_process_group()
    if int(t.item()) != n * (n + 1) // 2:
        sys.exit(f"wrong sum {t.item()}")
"""
_START = re.compile(r"GLSTART (\d+\.\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_direct(script: Path, env: dict[str, str]) -> float:
    """Spawn torchrun by hand; seconds from spawn to the last rank's first line."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        f"--log-dir={script.parent / 'direct-logs'}",  # else /tmp/torchelastic_*, left behind
        str(script),
    ]
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed:\n{done.stdout}\n{done.stderr}")
    stamps = [float(m) for m in _START.findall(done.stdout)]
    if len(stamps) != 2:
        raise RuntimeError(f"expected 2 start lines, got {stamps}:\n{done.stdout}")
    return max(stamps) - t0


class Cluster:
    """A ControlPlane on a temporary SQLite file with in-process workers of simulated GPUs."""

    def __init__(self, root: Path, gpus_per_worker: list[int]) -> None:
        self.root = root
        self.gpus = gpus_per_worker
        self.cp: Any = None
        self.store: Any = None
        self.agents: list[Any] = []
        self.dispatch: list[float] = []

    async def start(self) -> Cluster:
        from gpulayer_kernel.capabilities import simulated_capabilities
        from gpulayer_kernel.contracts import WorkerRegistration
        from gpulayer_kernel.controlplane import ControlPlane
        from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
        from gpulayer_kernel.worker.agent import WorkerAgent
        from gpulayer_kernel.worker.executor import ExecutorConfig
        from gpulayer_kernel.worker.transport import InProcessTransport

        self.store = SqliteStore(self.root / "cp.db")
        await self.store.open()
        self.cp = ControlPlane(self.store, LocalArtifactStore(self.root / "blobs"))
        await self.cp.start()
        for i, n in enumerate(self.gpus):
            agent = WorkerAgent(
                InProcessTransport(self.cp),
                WorkerRegistration(name=f"w{i}", capabilities=simulated_capabilities(n, "a100")),
                ExecutorConfig(work_root=self.root / f"w{i}"),
            )
            await agent.start()
            self.agents.append(agent)
        return self

    async def run(self, script: Path, gpus: int, nodes: int, env: dict[str, str]) -> float:
        """Submit the script as a gang; seconds from submit to the last rank's first line.

        Also records the dispatch part in ``self.dispatch``: submit -> the last node's worker
        about to spawn torchrun (its "torchrun: ..." line), i.e. GPUlayer's own overhead.
        """
        from gpulayer_kernel.contracts import JobSpec, JobState

        spec = JobSpec.model_validate(
            {
                "workload": {"kind": "command", "argv": ["python", str(script)]},
                "resources": {"gpus": gpus, "nodes": nodes},
                "env": env,
                "workdir": str(script.parent),
            }
        )
        t0 = time.time()
        job = await self.cp.submit(spec)
        job = await self.cp.wait(job.id, timeout=300)
        if job.state != JobState.SUCCEEDED:
            raise RuntimeError(f"gang job {job.state.value}: {job.reason}")
        page = await self.cp.logs(job.id, limit=5000)
        stamps = [float(m.group(1)) for r in page.records if (m := _START.search(r.text))]
        if len(stamps) != gpus * nodes:
            raise RuntimeError(f"expected {gpus * nodes} start lines, got {stamps}")
        spawned = [r.time for r in page.records if r.text.startswith("torchrun: ")]
        self.dispatch.append(max(spawned) - t0)
        return max(stamps) - t0

    async def stop(self) -> None:
        for agent in self.agents:
            await agent.stop()
        if self.cp is not None:
            await self.cp.close()
        if self.store is not None:
            await self.store.close()


def med(values: list[float]) -> float:
    return statistics.median(values)


async def main_async(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gl-bench-dist-"))
    try:
        script = tmp / "ranks.py"
        script.write_text(SCRIPT)
        collective = "0" if args.quick else "1"
        env = {**os.environ, "BENCH_COLLECTIVE": collective}
        for var in ("GPULAYER_URL", "GPULAYER_TOKEN"):
            env.pop(var, None)
        one = await Cluster(tmp / "one", [2]).start()
        two = await Cluster(tmp / "two", [1, 1]).start()
        job_env = {"BENCH_COLLECTIVE": collective}
        times: dict[str, list[float]] = {"torchrun": [], "gang-1x2": [], "gang-2x1": []}
        runs = {
            "torchrun": lambda: asyncio.to_thread(run_direct, script, env),
            "gang-1x2": lambda: one.run(script, 2, 1, job_env),
            "gang-2x1": lambda: two.run(script, 1, 2, job_env),
        }
        order = list(runs)
        try:
            if not args.quick:  # warm the page cache (torch's files) for every side alike
                for name in order:
                    await runs[name]()
            for r in range(args.rounds):
                rotated = order[r % 3 :] + order[: r % 3]
                for name in rotated:
                    times[name].append(await runs[name]())
                print(
                    f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f}s" for n in order),
                    flush=True,
                )
        finally:
            await one.stop()
            await two.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"machine: {describe()}")
    for name, label in (
        ("torchrun", "direct torchrun --nproc-per-node 2"),
        ("gang-1x2", "gang, 1 worker x 2 ranks"),
        ("gang-2x1", "gang, 2 workers x 1 rank"),
    ):
        vals = times[name]
        print(
            f"{label}: submit -> every rank running: median {med(vals):.3f}s "
            f"(min {min(vals):.3f}s, max {max(vals):.3f}s, n={len(vals)})"
        )
    for name, cluster in (("1 worker x 2 ranks", one), ("2 workers x 1 rank", two)):
        ms = [d * 1000 for d in cluster.dispatch[-args.rounds :]]
        print(
            f"gang dispatch, {name} (submit -> torchrun spawned): median {med(ms):.1f} ms "
            f"(max {max(ms):.1f} ms)"
        )
    print(f"2-worker gang/torchrun: {med(times['gang-2x1']) / med(times['torchrun']):.2f}x")
    print(f"gang/torchrun: {med(times['gang-1x2']) / med(times['torchrun']):.2f}x")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument(
        "--quick", action="store_true", help="1 round, no warm-up, ranks stop after line one"
    )
    args = p.parse_args()
    if args.quick:
        args.rounds = 1
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
