"""An interrupted test run leaves no process behind (issue 32, item 13; ``testing/reaper.py``).

A suite stopped by Ctrl-C or SIGTERM left ``slurmstepd``, a ``gpulayer worker``, ``jupyterlab``,
``postgres`` and a ``gpulayer serve`` running: fixtures start them in sessions of their own. Here
a small pytest run (two xdist workers) starts a real ``gpulayer serve``, a ``gpulayer worker``
joined to it, a PostgreSQL server and a detached process, and is stopped at a random moment:
SIGTERM to its controller (as ``kill`` does), or SIGINT to its whole process group (as Ctrl-C in
a terminal does). Every process it started must be gone soon after.

And the reaper at session start: a process left marked by a run that is gone (its watchdog
killed too) is ended by the next run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulayer_kernel.testing import wait_until
from gpulayer_kernel.testing.postgres import find_bin
from gpulayer_kernel.testing.reaper import OWNER_ENV, leftovers, start_time

pytestmark = pytest.mark.slow

INNER = """
import os, time
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess, WorkerProcess
from gpulayer_kernel.testing.postgres import PostgresServer, find_bin

PIDS = Path(os.environ["GL_PIDS"])


def record(*pids):
    with PIDS.open("a") as f:
        for pid in pids:
            f.write(f"{pid} {os.environ['GPULAYER_TEST_OWNER']}\\n")


@pytest.fixture
def served(tmp_path):
    with ServeProcess(tmp_path / "home", heartbeat_timeout=5) as server:
        record(server.pid)
        yield server


def test_a_server_and_a_worker(served, tmp_path):
    join = served.create_token("join")
    with WorkerProcess(served.url, join, name="w1", home=tmp_path / "w1") as worker:
        record(worker.pid)
        time.sleep(300)


def test_postgres_and_a_detached_process(tmp_path):
    import subprocess
    detached = subprocess.Popen(["sleep", "300"], start_new_session=True)
    record(detached.pid)
    if find_bin() is not None:
        pg = PostgresServer()
        pg.start()
        record(int((pg.data / "postmaster.pid").read_text().split()[0]))
    time.sleep(300)
"""


def _alive(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def _inner_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "GPULAYER_TEST_GROUPS", "GPULAYER_URL", "GPULAYER_TOKEN"))
    }
    env["GL_PIDS"] = str(tmp_path / "pids.txt")
    env["GPULAYER_HOME"] = str(tmp_path / "home")
    return env


def _start_inner(tmp_path: Path) -> subprocess.Popen[bytes]:
    (tmp_path / "test_inner.py").write_text(INNER)
    argv = [
        sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path),
        "-p", "gpulayer_kernel.testing.reaper", "-p", "no:cacheprovider",
        "-n", "2", "-q", "--timeout", "600", str(tmp_path / "test_inner.py"),
    ]  # fmt: skip
    with (tmp_path / "inner.log").open("wb") as log:
        return subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=_inner_env(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_an_interrupted_run_leaves_no_process(tmp_path: Path, how: str) -> None:
    rng = random.Random()
    inner = _start_inner(tmp_path)
    pids_file = tmp_path / "pids.txt"
    want = 3 + (1 if find_bin() is not None else 0)  # serve, worker, sleep, postgres
    try:
        # A random moment: while its processes start, or after they all run.
        early = rng.random() < 0.4
        if early:
            wait_until(pids_file.exists, 120, what="the first process to start")
            time.sleep(rng.uniform(0.0, 1.0))
        else:
            wait_until(
                lambda: pids_file.exists() and len(pids_file.read_text().split("\n")) > want,
                120,
                what="every process to start",
            )
            time.sleep(rng.uniform(0.0, 2.0))
        if how == "SIGTERM":
            inner.send_signal(signal.SIGTERM)  # `kill PID` of the run
        else:
            os.killpg(inner.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        inner.wait(120)
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait(30)
    rows = [line.split() for line in pids_file.read_text().splitlines() if line.strip()]
    started = {int(pid): start_time(int(pid)) for pid, _ in rows}
    owners = {owner for _, owner in rows}

    def none_left() -> bool:
        return not any(_alive(p, s) for p, s in started.items()) and not leftovers(owners)

    wait_until(none_left, 60, what="every process the run started to end")
    log = (tmp_path / "inner.log").read_text(errors="replace")
    print(f"{how} {'early' if early else 'late'}: {len(rows)} process(es) started, none left")
    assert rows, log


def test_the_next_run_ends_what_a_killed_run_left(tmp_path: Path) -> None:
    # Every run's reaper ends what any gone run left, and other tests of this suite start runs
    # of their own (the interrupted runs, the plugin's): one of them may end this leftover
    # first. Then this run had nothing to say, and the test tries again with a new leftover.
    for _ in range(3):
        said, ended_here = _a_run_after_a_killed_one(tmp_path)
        if ended_here:
            break
    assert ended_here, said


def _a_run_after_a_killed_one(tmp_path: Path) -> tuple[str, bool]:
    """A process left by a "run" that is gone, then a new run: its stderr, and whether the new
    run said it ended the leftover. The leftover is gone either way."""
    # A short-lived process whose mark a leftover carries. It waits on its stdin until its
    # start time is read: one that had exited already (a zombie) has none, and its mark would
    # read "PID:None".
    gone = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    owner = f"{gone.pid}:{start_time(gone.pid)}"
    gone.communicate(b"")
    env = {**os.environ, OWNER_ENV: owner}
    left = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    born = start_time(left.pid)
    try:
        (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path),
             "-p", "gpulayer_kernel.testing.reaper", "-p", "no:cacheprovider", "-q",
             str(tmp_path / "test_nothing.py")],
            cwd=tmp_path, env=_inner_env(tmp_path), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        left.wait(10)  # ended (and reaped here, its parent), by this run or by another
        assert not _alive(left.pid, born)
        return r.stderr, "left by earlier test runs" in r.stderr
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()


SLURM_INNER = """
import os, subprocess, time
from pathlib import Path

from gpulayer_kernel.testing.slurm import SlurmCluster

PIDS = Path(os.environ["GL_PIDS"])


def test_a_job_step(tmp_path):
    with SlurmCluster(tmp_path / "slurm") as cluster:
        cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300")
        root = str((tmp_path / "slurm").resolve())
        while True:  # the job's slurmstepd: it holds slurmd's log under the cluster's folder
            steps = []
            for pid in subprocess.run(["pgrep", "-x", "slurmstepd"], capture_output=True,
                                      text=True).stdout.split():
                fds = f"/proc/{pid}/fd"
                try:
                    if any(os.readlink(f"{fds}/{fd}").startswith(root) for fd in os.listdir(fds)):
                        steps.append(pid)
                except OSError:
                    pass
            if steps:
                break
            time.sleep(0.2)
        daemons = [str(p.pid) for p in cluster._procs.values()]
        PIDS.write_text(" ".join([*steps, *daemons]) + "\\n")
        time.sleep(300)
"""


@pytest.mark.skipif(not Path("/usr/sbin/slurmctld").exists(), reason="Slurm is not installed")
def test_a_killed_run_s_slurm_job_steps_end_too(tmp_path: Path) -> None:
    """SIGKILL of the run itself (no teardown at all): its watchdog ends the Slurm daemons and
    the job's slurmstepd, which cleared its environment and was reparented to init."""
    (tmp_path / "test_slurm_inner.py").write_text(SLURM_INNER)
    with (tmp_path / "inner.log").open("wb") as log:
        inner = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path),
             "-p", "gpulayer_kernel.testing.reaper", "-p", "no:cacheprovider", "-q",
             "--timeout", "600", str(tmp_path / "test_slurm_inner.py")],
            cwd=tmp_path, env=_inner_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    pids_file = tmp_path / "pids.txt"
    try:
        wait_until(pids_file.exists, 120, what="the job step to run")
        os.kill(inner.pid, signal.SIGKILL)  # the run itself, hard: nothing of it tears down
        inner.wait(30)
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait(30)
    pids = [int(p) for p in pids_file.read_text().split()]
    started = {p: start_time(p) for p in pids}
    wait_until(
        lambda: not any(_alive(p, s) for p, s in started.items()),
        60,
        what="slurmstepd and the Slurm daemons to end",
    )
