"""Nothing outlives its job or its worker: job supervisors and warm runners, for real.

A job's grandchild that double-forks and ``setsid``\\ s away from the job's process group is still
the job's: it dies when the job ends, and when the worker is killed with ``kill -9``. The warm
runner's process is reaped by its owner's ``stop`` (and only once), never left to the GC.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, until, wait_until
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.warm import WarmRunner

from ..conftest import WorkerFactory, pid_alive

PY = sys.executable

# Starts a grandchild that leaves the job's process group and session (a daemon's double fork),
# prints its pid, then exits or sleeps.
ESCAPE = """\
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode()); os.close(w)
        time.sleep(300)
    os._exit(0)
os.close(w)
print("grandchild", os.read(r, 32).decode(), flush=True)
if sys.argv[1:] == ["stay"]:
    time.sleep(300)
"""


def _escapee(lines: list[str]) -> int | None:
    for text in lines:
        if text.startswith("grandchild "):
            return int(text.split()[1])
    return None


def _gone_or_zombie(pid: int) -> bool:
    return not pid_alive(pid)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
async def test_a_setsid_grandchild_dies_when_its_job_ends(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, warm: bool
) -> None:
    await gl_worker(warm_runner=warm)
    job = await gl_cp.submit(JobSpec(workload=CommandWorkload(argv=[PY, "-c", ESCAPE])))
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED, done.reason
    page = await gl_cp.logs(job.id, limit=100)
    pid = _escapee([r.text for r in page.records])
    assert pid is not None
    await until(lambda: _gone_or_zombie(pid), 5, what=f"grandchild {pid} to die with its job")


async def test_a_cancelled_python_job_takes_its_setsid_grandchild(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    agent = await gl_worker(kill_grace=0.5)
    digest, data = bundles.build(
        {"esc.py": ESCAPE.replace('sys.argv[1:] == ["stay"]', "True").encode()}
    )
    await gl_cp.put_bundle(data, digest)
    job = await gl_cp.submit(JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="esc.py")))
    pid: int | None = None

    async def started() -> bool:
        nonlocal pid
        pid = _escapee([r.text for r in (await gl_cp.logs(job.id, limit=100)).records])
        return pid is not None

    await until(started, 30, what="the job to print its grandchild")
    assert pid is not None and agent.warm_runner.pid is not None  # it ran warm
    await gl_cp.cancel(job.id)
    assert (await gl_cp.wait(job.id, timeout=15)).state == JobState.CANCELLED
    await until(lambda: _gone_or_zombie(pid), 5, what=f"grandchild {pid} to die with its job")


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
def test_kill_9_of_a_worker_takes_a_setsid_grandchild_with_it(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "home", heartbeat_timeout=30) as server:
        join = server.create_token("join")
        with (
            WorkerProcess(server.url, join, name="w1", home=tmp_path / "w1") as worker,
            server.client() as c,
        ):
            job = c.submit(JobSpec(workload=CommandWorkload(argv=[PY, "-c", ESCAPE, "stay"])))
            pids: list[int] = []

            def started() -> bool:
                pid = _escapee([r.text for r in c.logs(job.id, limit=100).records])
                if pid is not None:
                    pids.append(pid)
                return pid is not None

            wait_until(started, 30, what="the job to print its grandchild")
            assert pid_alive(pids[0])
            worker.kill(signal.SIGKILL)  # no clean-up code runs in the worker
            wait_until(lambda: not pid_alive(pids[0]), 5, what="the grandchild to die")


# -- the warm runner's own process ---------------------------------------------------------------


def _reaped(pid: int) -> bool:
    """True once ``pid`` is gone entirely: exited *and* collected by its parent (no zombie)."""
    return not os.path.exists(f"/proc/{pid}")


async def _warm(gl_cp: ControlPlane) -> None:
    digest, data = bundles.build({"c.py": b"1 + 1\n"})
    await gl_cp.put_bundle(data, digest)
    job = await gl_cp.submit(JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="c.py")))
    assert (await gl_cp.wait(job.id, timeout=30)).state == JobState.SUCCEEDED


async def test_stopping_a_worker_reaps_its_warm_runner_once(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    agent = await gl_worker()
    await _warm(gl_cp)
    pid = agent.warm_runner.pid
    assert pid is not None
    await agent.stop()
    assert _reaped(pid)  # by stop() itself, not later by the garbage collector
    await agent.stop()  # idempotent
    agent.warm_runner.close()


async def test_a_closed_warm_runner_starts_no_new_zygote(tmp_path: Path) -> None:
    """A job still launching after its worker stopped must not start a zygote nobody reaps."""
    runner = WarmRunner(ExecutorConfig(work_root=tmp_path))
    runner.close()
    env = {"PATH": os.environ["PATH"], "GPULAYER_JOB_ID": "x"}
    assert await runner.spawn("c.py", tmp_path, env) is None
    assert await runner.exec(["true"], tmp_path, env) is None
    assert runner.pid is None


async def test_a_zygote_that_dies_is_reaped_without_its_owner(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    agent = await gl_worker()
    await _warm(gl_cp)
    pid = agent.warm_runner.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await until(lambda: agent.warm_runner.pid is None, 5, what="the worker to notice")
    await until(lambda: _reaped(pid), 5, what=f"zygote {pid} to be reaped")
