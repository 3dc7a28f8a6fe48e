"""Dead and removed workers with real processes (issue 12, items 1, 9 and 15): ``gpulayer serve``,
``gpulayer worker`` and the CLI on 127.0.0.1, with ``kill -9`` and a server restart."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.testing import GL, ServeProcess, WorkerProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]
PY = sys.executable
HAS_TORCH = importlib.util.find_spec("torch") is not None


def gl(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GL, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def client_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "client-home")  # nothing local to find
    yield env


def names(env: dict[str, str]) -> list[str]:
    r = gl(env, "workers", "--json")
    assert r.returncode == 0, r.stderr
    return sorted(w["name"] for w in json.loads(r.stdout))


def test_a_removed_worker_stays_gone_after_a_restart(
    tmp_path: Path, client_env: dict[str, str]
) -> None:
    # A long heartbeat timeout: the killed worker is still "in service" when it is removed, so
    # without the removal the restart would bring its stored record back.
    with ServeProcess(tmp_path / "home", heartbeat_timeout=120) as server:
        env = {**client_env, **server.client_env()}
        join = server.create_token("join", ttl=600)
        with (
            WorkerProcess(server.url, join, name="w1", home=tmp_path / "w1") as w1,
            WorkerProcess(server.url, join, name="w2", home=tmp_path / "w2"),
        ):
            with server.client() as c:
                job = c.submit(
                    JobSpec(
                        workload=CommandWorkload(argv=[PY, "-c", "import time; time.sleep(120)"]),
                        resources=Resources(worker="w1"),
                    )
                )
                wait_until(lambda: c.get(job.id).state == JobState.RUNNING, 60, what="running")
            w1.kill()  # kill -9: no goodbye
            r = gl(env, "workers", "remove", "w1")
            assert r.returncode != 0 and "is running 1 job" in r.stderr, r.stderr
            assert "--force" in r.stderr
            r = gl(env, "workers", "remove", "w1", "--force")
            assert r.returncode == 0, r.stderr
            assert "worker w1" in r.stdout and "removed" in r.stdout
            assert names(env) == ["w2"]
            with server.client() as c:
                done = c.get(job.id)
            assert done.state == JobState.LOST
            assert done.reason is not None and "removed by an admin" in done.reason
            server.restart()
            env = {**client_env, **server.client_env()}
            wait_until(lambda: names(env) == ["w2"], 30, what="w2 alone after the restart")


def test_a_job_that_can_never_fit_fails_at_once_unless_asked_to_wait(
    tmp_path: Path, client_env: dict[str, str]
) -> None:
    with ServeProcess(tmp_path / "home", heartbeat_timeout=60) as server:
        env = {**client_env, **server.client_env()}
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", simulate_gpus=2, home=tmp_path / "w1"):
            r = gl(env, "run", "--gpus", "4", "--", "true")
            assert r.returncode == 1, r.stderr
            assert "the largest worker has 2" in r.stdout + r.stderr
            r = gl(env, "run", "--gpus", "4", "--wait", "--detach", "--", "true")
            assert r.returncode == 0, r.stderr
            job_id = r.stdout.split()[-1] if r.stdout.split() else ""
            with server.client() as c:
                queued = [j for j in c.list() if j.spec.wait_for_capacity]
                assert len(queued) == 1 and job_id in (queued[0].id, "")
                wait_until(lambda: c.get(queued[0].id).pending is not None, 30)
                assert c.get(queued[0].id).state == JobState.QUEUED
                c.cancel(queued[0].id)


ALLREDUCE_FOREVER = """\
import os, time
import torch
import torch.distributed as dist
from gpulayer_kernel.torch import init_distributed, rank
init_distributed(backend="gloo")
print(f"pid {os.getpid()} rank {rank()} world {os.environ['WORLD_SIZE']}", flush=True)
t = torch.zeros(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
"""


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (torchrun needed)")
def test_a_worker_killed_mid_gang_is_named_and_gets_no_new_gang(tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text(textwrap.dedent(ALLREDUCE_FOREVER))
    # The heartbeat timeout is far off: what says the worker died is its closed connection.
    with ServeProcess(tmp_path / "home", heartbeat_timeout=120) as server:
        join = server.create_token("join", ttl=600)
        workers = {
            n: WorkerProcess(server.url, join, name=n, simulate_gpus=1, home=tmp_path / n)
            for n in ("wa", "wb")
        }
        try:
            for w in workers.values():
                w.start()
            with server.client() as c:
                spec = JobSpec(
                    workload=CommandWorkload(argv=[PY, str(script)]),
                    resources=Resources(gpus=1, nodes=2),
                    workdir=str(tmp_path),
                )
                job = c.submit(spec)

                def both_ranks() -> bool:
                    texts = [r.text for r in c.logs(job.id, limit=5000).records]
                    return sum(t.startswith("pid ") for t in texts) == 2

                wait_until(both_ranks, 90, what="both ranks running")
                placed = c.get(job.id).placement
                assert placed is not None
                # The worker of node 1: node 0's rank then fails with "lost a peer".
                victim = next(n.worker_name for n in placed.nodes if n.node_rank == 1)
                workers[victim].kill()
                done = c.wait(job.id, 60)
                assert done.state in (JobState.FAILED, JobState.LOST), done
                assert done.reason is not None and f"worker {victim} was lost" in done.reason
                # A new gang right after is not placed on the dead worker: it waits.
                again = c.submit(spec)
                wait_until(lambda: c.get(again.id).pending is not None, 30, what="a report")
                after = c.get(again.id)
                assert after.state == JobState.QUEUED, after
                assert after.pending is not None and "suspect" in after.pending.sentence
                dead = next(w for w in c.workers() if w.name == victim)
                assert dead.suspect is not None and dead.live
                c.cancel(again.id)
        finally:
            for w in workers.values():
                with contextlib.suppress(Exception):
                    w.stop()
