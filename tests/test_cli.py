"""The ``gpulayer`` command line against the embedded default, as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer_kernel.testing import wait_until

from .conftest import pid_alive

GL = [sys.executable, "-m", "gpulayer_kernel.cli"]


def gl(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,  # type: ignore[call-overload]
    )


def test_run_prints_the_line_and_exits_zero(gl_home: Path) -> None:
    r = gl("run", "--", sys.executable, "-c", "print('hello from a worker')")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello from a worker\n"
    assert "submitted" in r.stderr


def test_a_failing_command_exit_code_comes_back(gl_home: Path) -> None:
    r = gl("run", "--", "sh", "-c", "echo to-stderr >&2; exit 3")
    assert r.returncode == 3
    assert "to-stderr" in r.stderr
    assert "failed: exited with code 3" in r.stderr


def test_logs_show_and_jobs_after_the_fact(gl_home: Path) -> None:
    gl("run", "--name", "first", "--", "sh", "-c", "echo one; echo two >&2")
    jobs = json.loads(gl("jobs", "--json").stdout)
    assert [j["spec"]["name"] for j in jobs] == ["first"]
    job_id = jobs[0]["id"]
    logs = gl("logs", job_id[:6])
    assert logs.returncode == 0
    assert logs.stdout == "one\n" and "two" in logs.stderr
    shown = json.loads(gl("show", job_id).stdout)
    assert shown["state"] == "succeeded" and shown["exit_code"] == 0
    table = gl("jobs").stdout
    assert "first" in table and "succeeded" in table
    assert "placed on" in gl("explain", job_id).stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "no command given"),
        (["run", "--env", "NOEQUALS", "--", "true"], "is not KEY=VALUE"),
        (["run", "--gpus", "-1", "--", "true"], "resources.gpus"),
        (["logs", "ffffffffffff"], "no job"),
        (["show", "ab"], "too short"),
    ],
)
def test_bad_input_gets_a_clear_error(gl_home: Path, args: list[str], message: str) -> None:
    r = gl(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_option_prints_usage(gl_home: Path) -> None:
    r = gl("run", "--gpuz", "2", "--", "true")
    assert r.returncode == 2 and "usage:" in r.stderr


def test_database_from_a_newer_schema_is_refused(gl_home: Path) -> None:
    gl_home.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(gl_home / "gpulayer.db")
    con.execute("PRAGMA user_version = 999")
    con.commit()
    con.close()
    r = gl("jobs")
    assert r.returncode == 2
    assert "schema version 999" in r.stderr and "upgrade" in r.stderr


SPAWNER = (
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print('pid', c.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def _start_run(*extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [*GL, "run", *extra, "--", sys.executable, "-c", SPAWNER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("pid "), line + (proc.stderr.read() if proc.stderr else "")
    return proc, int(line.split()[1])


def _gone(pid: int, within: float = 10.0) -> bool:
    try:
        wait_until(lambda: not pid_alive(pid), within, what=f"process {pid} to end")
    except TimeoutError:
        return False
    return True


def test_ctrl_c_cancels_the_job_and_kills_its_process_group(gl_home: Path) -> None:
    proc, child = _start_run()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "cancelling the job" in err and "cancelled" in err
    assert _gone(child), "the job's child process survived Ctrl-C"
    [job] = json.loads(gl("jobs", "--json").stdout)
    assert job["state"] == "cancelled"


def test_a_second_process_connects_to_the_live_run_instead_of_the_database(
    gl_home: Path,
) -> None:
    proc, child = _start_run("--name", "long")
    try:
        owner = json.loads((gl_home / "controlplane.lock").read_text())
        assert owner["url"].startswith("http://127.0.0.1:")
        assert oct((gl_home / "controlplane.lock").stat().st_mode)[-3:] == "600"
        listed = gl("jobs", "--json")
        assert listed.returncode == 0, listed.stderr
        [job] = json.loads(listed.stdout)
        assert (job["spec"]["name"], job["state"]) == ("long", "running")
        cancel = gl("cancel", job["id"])
        assert cancel.returncode == 0 and "cancelled" in cancel.stdout
        proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert _gone(child)
    finally:
        proc.kill()
        proc.communicate()


def test_a_killed_gpulayer_run_leaves_no_running_job_behind(gl_home: Path) -> None:
    proc, child = _start_run()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    # The next control plane finds the job's worker gone: the job is lost, not running forever.
    [job] = json.loads(gl("jobs", "--json").stdout)
    assert job["state"] == "lost"
    assert "host process stopped" in job["reason"]
    # The next local worker stops what the dead one's job left behind (no orphans).
    assert gl("run", "--", "true").returncode == 0
    assert _gone(child), "a process of the killed run's job is still alive"


def test_a_gpu_job_without_gpus_says_why_it_waits_and_ctrl_c_cancels_it(gl_home: Path) -> None:
    proc = subprocess.Popen(
        [*GL, "run", "--gpus", "1", "--", "true"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "waiting:" in line:
            break
    assert "0/1 workers can run job" in lines[-1] and "GPU" in lines[-1], lines
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    [job] = json.loads(gl("jobs", "--json").stdout)
    assert job["state"] == "cancelled"


def test_explain_works_from_a_fresh_process(gl_home: Path) -> None:
    job_id = gl("run", "--detach", "--gpus", "1", "--", "true").stdout.strip()
    out = gl("explain", job_id)
    assert out.returncode == 0
    assert "workers can run job" in out.stdout or "no workers" in out.stdout, out.stdout
