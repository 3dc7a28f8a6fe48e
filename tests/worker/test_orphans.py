"""One fork per job (issue 35): the zygote supervises its jobs' processes itself. What a job
leaves when it ends (a grandchild that ``setsid``\\ s out of its group, even one that dropped the
job id from its environment) is killed, never while the job it may belong to still runs, and
everything dies when the zygote is killed hard (its keeper)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.orphans import IDLE, job_of
from gpulayer_kernel.worker.spares import ZygoteChild
from gpulayer_kernel.worker.warm import WarmRunner

from ..conftest import pid_alive

POOL = 2
SLEEP = shutil.which("sleep") or "/bin/sleep"

# Leaves a grandchild that double-forks out of the job's session (its middle process exits, so
# the grandchild is orphaned at once), prints its pid, then waits for a file "go" in its cwd.
# With SCRUB=1 the grandchild execs sleep with an empty environment: no job id to read.
ESCAPE = f"""\
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode()); os.close(w)
        if os.environ.get("SCRUB") == "1":
            os.execve({SLEEP!r}, ["sleep", "300"], {{}})
        time.sleep(300)
    os._exit(0)
os.close(w)
print("escapee", os.read(r, 32).decode(), flush=True)
while not os.path.exists("go"):
    time.sleep(0.01)
"""


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _gone(pid: int) -> bool:
    return not pid_alive(pid)


class Job:
    """One job that leaves an escapee, and waits for ``go`` to end."""

    def __init__(self, child: ZygoteChild, cwd: Path, escapee: int) -> None:
        self.child = child
        self.cwd = cwd
        self.escapee = escapee

    async def end(self) -> int:
        (self.cwd / "go").touch()
        code = await asyncio.wait_for(self.child.wait(), 15)
        self.child.close()
        return code


async def _start(runner: WarmRunner, root: Path, job_id: str, scrub: bool) -> Job:
    cwd = root / job_id
    cwd.mkdir()
    (cwd / "esc.py").write_text(ESCAPE)
    env = {"PATH": os.environ["PATH"], "GPULAYER_JOB_ID": job_id, "SCRUB": "1" if scrub else ""}
    child = await runner.spawn("esc.py", cwd, env)
    assert child is not None and child.stdout is not None, "it fell back to the cold spawn"
    line = await asyncio.wait_for(child.stdout.readline(), 15)
    escapee = int(line.split()[1])
    zygote = runner.pid
    # Orphaned (its middle process is gone): re-parented to the zygote, our subreaper.
    await until(lambda: _parent(escapee) == zygote, 5, what="the escapee to be the zygote's")
    if scrub:
        await until(lambda: job_of(escapee) == "", 5, what="the escapee to drop its job id")
    else:
        assert job_of(escapee) == job_id
    return Job(child, cwd, escapee)


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[WarmRunner]:
    runner = WarmRunner(ExecutorConfig(work_root=tmp_path), preload=lambda: (), pool=POOL)
    env = {"PATH": os.environ["PATH"]}
    warm = await runner.spawn("cell:c.py", tmp_path, env, sources={"c.py": "None\n"})
    assert warm is not None
    await warm.wait()
    warm.close()
    await until(lambda: runner.spares() == POOL, 30, what="the spares")
    yield runner
    runner.close()


@pytest.mark.parametrize("scrub", [False, True], ids=["marked", "unmarked"])
async def test_a_jobs_escapee_dies_when_its_job_ends(
    runner: WarmRunner, tmp_path: Path, scrub: bool
) -> None:
    spares = set(runner.spare_pids())
    job = await _start(runner, tmp_path, "aaaa00000001", scrub)
    assert job.child.pid in spares  # it ran in a spare: its id is in the spare's slot
    assert job_of(job.child.pid) == "aaaa00000001"
    assert pid_alive(job.escapee)
    assert await job.end() == 0
    await until(lambda: _gone(job.escapee), 5, what="the escapee to die with its job")


@pytest.mark.parametrize("scrub", [False, True], ids=["marked", "unmarked"])
async def test_an_escapee_is_never_killed_while_its_job_runs(
    runner: WarmRunner, tmp_path: Path, scrub: bool
) -> None:
    """Another job's end sweeps the zygote's orphans: a running job's escapee is spared, even one
    that cannot be told apart (unmarked); it dies once its own job has ended."""
    a = await _start(runner, tmp_path, "aaaa00000001", scrub)
    b = await _start(runner, tmp_path, "bbbb00000002", scrub)
    assert await b.end() == 0
    if not scrub:  # b's escapee names b: killed at b's end
        await until(lambda: _gone(b.escapee), 5, what="b's escapee to die with b")
    # The zygote sweeps before it reports an end, in one thread: once a later job's end is
    # reported, every sweep after b's end (b's escapee's death included) is done.
    later = await runner.spawn(
        "cell:c.py", tmp_path, {"PATH": os.environ["PATH"]}, sources={"c.py": "None\n"}
    )
    assert later is not None
    assert await later.wait() == 0
    later.close()
    assert pid_alive(a.escapee)
    assert await a.end() == 0
    await until(lambda: _gone(a.escapee), 5, what="a's escapee to die with a")
    await until(lambda: _gone(b.escapee), 5, what="b's escapee, by then")


async def test_an_idle_spare_owns_nothing(runner: WarmRunner) -> None:
    for pid in runner.spare_pids():
        assert job_of(pid) == IDLE


async def test_the_zygote_killed_hard_takes_every_escapee(
    runner: WarmRunner, tmp_path: Path
) -> None:
    job = await _start(runner, tmp_path, "aaaa00000001", scrub=True)
    zygote = runner.pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)  # its keeper kills everything below it
    assert await asyncio.wait_for(job.child.wait(), 15) == -signal.SIGKILL
    job.child.close()
    await until(lambda: _gone(job.child.pid), 5, what="the job's process to die")
    await until(lambda: _gone(job.escapee), 5, what="the escapee to die with the zygote")
