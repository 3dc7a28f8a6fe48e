"""The warm runner: Python jobs forked from the worker's zygote behave as cold-spawned ones."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import CommandWorkload, Job, JobSpec, JobState, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.testing import until
from gpulayer_kernel.worker import zygote_client
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.processes import reap_leftovers

from ..conftest import WorkerFactory, pid_alive

Run = Callable[..., Awaitable[tuple[Job, list[str], list[str]]]]


async def _gone(pid: int, seconds: float = 15.0) -> None:
    """Return once ``pid`` has exited; fail the test if it still runs after ``seconds``.

    Generous on purpose: a death that propagates through parent-death signals (worker → keeper
    → zygote → job) waits on the scheduler of a shared 2-core machine at each hop. On a
    failure, the process's own /proc status says where it stuck.
    """
    try:
        await until(lambda: not pid_alive(pid), seconds, what=f"process {pid} to exit")
    except TimeoutError as exc:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            status = "(gone meanwhile)"
        raise TimeoutError(f"{exc}; /proc/{pid}/status:\n{status}") from None


@pytest.fixture
async def gl_zworker(gl_worker: WorkerFactory) -> AsyncIterator[WorkerFactory]:
    """``gl_worker``; at the end each worker's zygote is stopped, and checked gone."""
    agents: list[WorkerAgent] = []

    async def start(**kw: Any) -> WorkerAgent:
        agent = await gl_worker(**kw)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        pid = agent.warm_runner.pid
        agent.warm_runner.close()
        if pid is not None:
            await _gone(pid)


@pytest.fixture
def run(gl_cp: ControlPlane) -> Run:
    """Run a Python workload: ``await run({"m.py": src}, "m:f")`` → (job, stdout, stderr)."""

    async def run(
        files: dict[str, str], entrypoint: str, **spec: Any
    ) -> tuple[Job, list[str], list[str]]:
        digest, data = bundles.build({k: v.encode() for k, v in files.items()})
        await gl_cp.put_bundle(data, digest)
        wl = PythonWorkload(bundle=digest, entrypoint=entrypoint, args=spec.pop("args", {}))
        job = await gl_cp.submit(JobSpec(workload=wl, **spec))
        done = await gl_cp.wait(job.id, timeout=30)
        page = await gl_cp.logs(job.id, limit=5000)
        out = [r.text for r in page.records if r.stream == "stdout"]
        err = [r.text for r in page.records if r.stream == "stderr"]
        return done, out, err

    return run


# Facts about the process a job runs in, which must not depend on how it was started.
PARENT_OF = "(lambda pid: int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]))"
FACTS = (
    f"PARENT_OF = {PARENT_OF}\n"
    + """\
import os, signal, sys
env, jid = dict(os.environ), os.environ["GPULAYER_JOB_ID"]
for k in ("GPULAYER_JOB_ID", "GPULAYER_OUTPUT", "GPULAYER_RESULT", "GPULAYER_CONTROL",
          "GPULAYER_ARGS"):
    env[k] = env[k].replace(jid, "ID").split("/jobs/")[-1]
facts = {
    "env": env,
    "cwd": os.path.basename(os.getcwd()),
    "argv": sys.argv,
    "path": [p.replace(os.getcwd(), "CWD") for p in sys.path],
    "streams": [(s.encoding, s.errors, s.line_buffering, s.write_through)
                for s in (sys.stdin, sys.stdout, sys.stderr)],
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigchld": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
    # A session and process group of its own, apart from the worker's...
    "own_session": os.getsid(0) == os.getpgid(0) != int(os.environ["WORKER_PGID"]),
    "name": __name__,
    "x": x,
}
# ... led by the process the worker sees as the job: itself (warm), its supervisor (cold).
pgid = os.getpgid(0)
leader = "self" if pgid == os.getpid() else "parent" if pgid == os.getppid() else "other"
print("parents", os.getppid(), PARENT_OF(os.getppid()), leader, flush=True)
proc_env = open("/proc/self/environ", "rb").read().split(b"\\0")
print("proc", f"GPULAYER_JOB_ID={os.environ['GPULAYER_JOB_ID']}".encode() in proc_env,
      any(v.startswith(b"GPULAYER_TOKEN=") for v in proc_env))
facts
"""
)


async def test_a_cell_runs_in_the_zygote_exactly_as_in_a_fresh_interpreter(
    gl_zworker: WorkerFactory, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_TOKEN", "worker-secret-token")
    seen: dict[str, tuple[Job, list[str], list[str]]] = {}
    for warm in (True, False):  # one worker at a time, so each job lands on the one we mean
        agent = await gl_zworker(name=f"w-{warm}", warm_runner=warm)
        env = {"MINE": "1", "WORKER_PGID": str(os.getpgid(0))}
        seen[str(warm)] = await run({"cell.py": FACTS}, "cell:cell.py", args={"x": [1, 2]}, env=env)
        if warm:
            zygote_pid = agent.warm_runner.pid
        await agent.stop()
    (w, w_out, w_err), (c, c_out, c_err) = seen["True"], seen["False"]
    assert w.state == c.state == JobState.SUCCEEDED, (w_err, c_err)
    # Warm: forked by the zygote itself, leading its own group (one fork per job, issue 35).
    assert w_out[0] == f"parents {zygote_pid} {w_out[0].split()[2]} self"
    # Cold: under its supervisor, which the worker started and which leads the group.
    assert c_out[0] == f"parents {c_out[0].split()[1]} {os.getpid()} parent"
    assert w_out[1] == c_out[1] == "proc True False"  # /proc names the job; no worker token
    assert "GPULAYER_TOKEN" not in w.result["env"] and w.result["env"]["MINE"] == "1"
    assert w.result["own_session"] and w.result["x"] == [1, 2]
    assert w.result == c.result


async def test_logs_results_and_tracebacks_match_the_cold_path(
    gl_zworker: WorkerFactory, run: Run
) -> None:
    agent = await gl_zworker()
    files = {
        "mathjob.py": "def add(a, b):\n    print('adding', a, b)\n    return {'sum': a + b}\n",
        "boom.py": "def f():\n    x = 1\n    raise ValueError('bad')\n",
        "script.py": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n",
    }
    done, out, _ = await run(files, "mathjob:add", args={"a": 2, "b": 3})
    assert (done.state, done.result, out) == (JobState.SUCCEEDED, {"sum": 5}, ["adding 2 3"])
    done, _, err = await run(files, "boom:f")
    assert done.state == JobState.FAILED and done.exit_code == 1
    text = "\n".join(err)
    assert 'boom.py", line 3' in text and "ValueError: bad" in text
    assert "gpulayer_kernel" not in text
    done, out, err = await run(files, "script.py")
    assert (done.state, out, err) == (JobState.SUCCEEDED, ["out"], ["err"])
    assert agent.warm_runner.pid is not None


@pytest.mark.parametrize(
    ("source", "code", "reason"),
    [
        ("import sys\nsys.exit(3)\n", 3, "exited with code 3"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 137, "killed by SIGKILL"),
        ("import os\nos._exit(5)\n", 5, "exited with code 5"),
    ],
)
async def test_exit_codes_come_back(
    gl_zworker: WorkerFactory, run: Run, source: str, code: int, reason: str
) -> None:
    agent = await gl_zworker()
    done, _, _ = await run({"job.py": source}, "job.py")
    assert (done.state, done.exit_code, done.reason) == (JobState.FAILED, code, reason)
    assert agent.warm_runner.pid is not None  # it ran warm


# The job's parent: the zygote (warm); and its grandparent: the worker, for a cold spawn (its
# parent is its supervisor).
PARENT = "import os\nos.getppid()"
GRANDPARENT = f"import os\n{PARENT_OF}(os.getppid())"

SPAWNER = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
print('pids', os.getpid(), child.pid, flush=True)
time.sleep(60)
"""


async def _pids(cp: ControlPlane, job_id: str) -> list[int]:
    since = 0
    while True:
        page = await cp.logs(job_id, since=since, wait=10)
        since = page.next_since
        for r in page.records:
            if r.text.startswith("pids "):
                return [int(p) for p in r.text.split()[1:]]
        assert not page.state.terminal


async def _submit(cp: ControlPlane, files: dict[str, str], entry: str, **spec: Any) -> Job:
    digest, data = bundles.build({k: v.encode() for k, v in files.items()})
    await cp.put_bundle(data, digest)
    return await cp.submit(
        JobSpec(workload=PythonWorkload(bundle=digest, entrypoint=entry), **spec)
    )


async def test_cancel_kills_the_process_group_with_a_grandchild(
    gl_cp: ControlPlane, gl_zworker: WorkerFactory
) -> None:
    agent = await gl_zworker(kill_grace=1.0)
    job = await _submit(gl_cp, {"spawn.py": SPAWNER}, "spawn.py")
    main, child = await _pids(gl_cp, job.id)
    group = os.getpgid(main)
    assert os.getsid(main) == group and os.getpgid(child) == group != os.getpgid(0)
    assert agent.warm_runner.pid is not None
    await gl_cp.cancel(job.id)
    done = await gl_cp.wait(job.id, timeout=15)
    assert (done.state, done.reason) == (JobState.CANCELLED, "cancelled by user")
    await _gone(main)
    await _gone(child)


async def test_timeout_kills_a_warm_job(gl_cp: ControlPlane, gl_zworker: WorkerFactory) -> None:
    await gl_zworker(kill_grace=0.5)
    job = await _submit(gl_cp, {"spawn.py": SPAWNER}, "spawn.py", timeout=1.0)
    main, child = await _pids(gl_cp, job.id)
    done = await gl_cp.wait(job.id, timeout=15)
    assert done.state == JobState.FAILED
    assert done.reason is not None and "timed out after 1s" in done.reason
    await _gone(main)
    await _gone(child)


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
async def test_a_dead_zygote_is_replaced_and_its_running_job_fails_cleanly(
    gl_cp: ControlPlane, gl_zworker: WorkerFactory, run: Run
) -> None:
    agent = await gl_zworker(kill_grace=0.5)
    job = await _submit(gl_cp, {"spawn.py": SPAWNER}, "spawn.py")
    main, child = await _pids(gl_cp, job.id)
    first = agent.warm_runner.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    done = await gl_cp.wait(job.id, timeout=15)
    assert (done.state, done.reason) == (JobState.FAILED, "killed by SIGKILL")
    await _gone(main)
    await _gone(child)
    done, out, _ = await run({"cell.py": PARENT}, "cell:cell.py")
    second = agent.warm_runner.pid
    assert done.state == JobState.SUCCEEDED and second not in (None, first)
    assert done.result == second


async def test_a_zygote_that_cannot_start_falls_back_to_a_fresh_interpreter(
    gl_zworker: WorkerFactory, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: zygote_client.ZygoteClient) -> None:
        raise zygote_client.ZygoteUnavailable("broken on purpose")

    monkeypatch.setattr(zygote_client.ZygoteClient, "start", broken)
    agent = await gl_zworker()
    done, _, _ = await run({"cell.py": GRANDPARENT}, "cell:cell.py")
    assert done.state == JobState.SUCCEEDED and done.result == os.getpid()  # setpriv execs
    assert agent.warm_runner.pid is None


async def test_startup_variables_take_the_cold_path(gl_zworker: WorkerFactory, run: Run) -> None:
    agent = await gl_zworker()
    cell = "import os, sys\n(os.getppid(), sys.flags.optimize)"
    done, _, _ = await run({"cell.py": cell}, "cell:cell.py", env={"PYTHONOPTIMIZE": "1"})
    # A fresh interpreter (it honours the variable), exec'd by the zygote (posix_spawn).
    assert done.state == JobState.SUCCEEDED and done.result == [agent.warm_runner.pid, 1]


async def test_reap_leftovers_recognises_warm_job_processes(tmp_path: Path) -> None:
    """A crashed worker's successor finds zygote-forked jobs by /proc/PID/environ, as cold ones."""
    client = zygote_client.ZygoteClient(sys.executable, (), {"PATH": os.environ["PATH"]})
    await client.start()
    try:
        job_dir = tmp_path / "jobs" / "abc123def456-1"
        job_dir.mkdir(parents=True)
        (job_dir / "cell.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
        env = {"PATH": os.environ["PATH"], "GPULAYER_JOB_ID": "abc123def456"}
        child = await client.spawn("cell:cell.py", job_dir, env)
        assert child.stdout is not None
        assert await asyncio.wait_for(child.stdout.readline(), 10) == b"up\n"  # set up
        (job_dir / "pgid").write_text(str(child.pid))
        killed = await asyncio.to_thread(reap_leftovers, tmp_path)
        assert child.pid in killed  # the job's supervisor (the job dies with it, or is killed)
        assert await child.wait() == -signal.SIGKILL
        child.close()
    finally:
        client.close()
    assert client.zygote_pid is not None
    await _gone(client.zygote_pid)


WORKER = """\
import asyncio, os, sys, time
from pathlib import Path
from gpulayer_kernel.worker import zygote_client

async def main():
    client = zygote_client.ZygoteClient(sys.executable, (), {"PATH": os.environ["PATH"]})
    await client.start()
    d = Path(sys.argv[1])
    (d / "cell.py").write_text("import time\\ntime.sleep(60)\\n")
    child = await client.spawn("cell:cell.py", d, {"GPULAYER_JOB_ID": "x"})
    print(client.zygote_pid, child.pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_worker_killed_hard_leaves_no_zygote_and_no_job(tmp_path: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 30)
        zygote_pid, job_pid = map(int, line.split())
        assert pid_alive(zygote_pid) and pid_alive(job_pid)
        worker.kill()  # SIGKILL: no clean-up code runs in the worker
        await _gone(zygote_pid)
        await _gone(job_pid)
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()  # type: ignore[union-attr]


def test_the_zygote_imports_the_runner_but_not_heavy_modules() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from gpulayer_kernel.worker import zygote
        print(json.dumps(sorted(m for m in ("pydantic", "torch", "numpy") if m in sys.modules)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


EXIT_CELL = """\
import atexit, os, threading, time
f = open(os.path.join(os.environ["GPULAYER_OUTPUT"], "o.txt"), "w")
f.write("unclosed")
def keep(): return f  # a cycle through the namespace
atexit.register(print, "atexit ran")
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
import weakref
class Held: pass
held = Held()
weakref.finalize(held, print, "finalizer ran")
"""


async def test_exit_joins_threads_runs_atexit_and_leaves_files_as_the_cold_path(
    gl_cp: ControlPlane, gl_zworker: WorkerFactory, run: Run
) -> None:
    written = []
    for warm in (True, False):
        agent = await gl_zworker(name=f"w-{warm}", warm_runner=warm)
        done, out, _ = await run({"cell.py": EXIT_CELL}, "cell:cell.py")
        assert done.state == JobState.SUCCEEDED and out[0] == "thread done", out
        assert sorted(out[1:]) == ["atexit ran", "finalizer ran"], out
        [art] = done.artifacts
        written.append(await gl_cp.get_blob(art.digest))
        await agent.stop()
    assert written[0] == written[1]  # (b"": not even a fresh interpreter flushes that file)


async def test_the_zygotes_finalizers_are_not_the_jobs(
    gl_cp: ControlPlane,
    gl_zworker: WorkerFactory,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finalizer a preloaded module made runs in neither the zygote's job nor its spares'
    jobs; the job's own ones do (with the preload, as without)."""
    probe = "gpulayer_kernel.testing.finalizer_probe"
    monkeypatch.setenv("GPULAYER_ZYGOTE_PRELOAD", probe)
    agent = await gl_zworker(name="w-preload")
    agent.warm_runner.prewarm()
    await until(agent.warm_runner.warm, 60, what="the preloading zygote to come up")
    # needs_torch.py reads a cell's imports, run or not: this one forks from the preloading zygote.
    cell = f"import {probe}\nif False:\n    import torch\n" + EXIT_CELL
    for _ in range(3):  # the spares, and then a job forked when it comes
        done, out, _ = await run({"cell.py": cell}, "cell:cell.py")
        assert done.state == JobState.SUCCEEDED, done
        assert sorted(out) == ["atexit ran", "finalizer ran", "thread done"], out


# -- commands, spawned by the zygote -------------------------------------------------------------


async def test_a_command_is_found_on_the_jobs_own_path(
    gl_cp: ControlPlane, gl_zworker: WorkerFactory, tmp_path: Path
) -> None:
    """The job's PATH, not the worker's, finds its program (the cold path's rule)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "only-here"
    tool.write_text("#!/bin/sh\necho found on the job PATH\n")
    tool.chmod(0o755)
    agent = await gl_zworker()
    path = f"{tools}{os.pathsep}{os.environ['PATH']}"
    job = await gl_cp.submit(
        JobSpec(workload=CommandWorkload(argv=["only-here"]), env={"PATH": path})
    )
    done = await gl_cp.wait(job.id, timeout=30)
    page = await gl_cp.logs(job.id)
    assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0), done.reason
    assert [r.text for r in page.records if r.stream == "stdout"] == ["found on the job PATH"]
    assert agent.warm_runner.pid is not None  # through the zygote, not the cold spawn


async def test_a_command_that_cannot_be_executed_fails_with_127_and_says_why(
    gl_cp: ControlPlane, gl_zworker: WorkerFactory, tmp_path: Path
) -> None:
    script = tmp_path / "bad-interpreter"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    await gl_zworker()
    job = await gl_cp.submit(JobSpec(workload=CommandWorkload(argv=[str(script)])))
    done = await gl_cp.wait(job.id, timeout=30)
    assert (done.state, done.exit_code) == (JobState.FAILED, 127)
    assert done.reason is not None and str(script) in done.reason, done.reason
    assert "No such file or directory" in done.reason
