"""The ``gpulayer`` command line against the embedded default, as real subprocesses."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.home import Layout, live_owner
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


@pytest.mark.slow  # ~7 s with two xdist workers on two cores
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
        (["run", "--env", "=NOKEY", "--", "true"], "is not KEY=VALUE"),
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


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_ctrl_c_cancels_the_job_and_kills_its_process_group(gl_home: Path) -> None:
    proc, child = _start_run()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "cancelling the job" in err and "cancelled" in err
    assert _gone(child), "the job's child process survived Ctrl-C"
    [job] = json.loads(gl("jobs", "--json").stdout)
    assert job["state"] == "cancelled"


@pytest.mark.slow  # ~6 s with two xdist workers on two cores
def test_a_second_process_connects_to_the_live_run_instead_of_the_database(
    gl_home: Path,
) -> None:
    proc, child = _start_run("--name", "long")
    try:
        # The run serves its API a moment after it starts (not on the way to its job); a second
        # process reading the lock waits for the address it announced.
        assert json.loads((gl_home / "controlplane.lock").read_text())["pid"] == proc.pid
        owner = live_owner(Layout(gl_home))
        assert owner["url"].startswith("http://127.0.0.1:")
        assert oct((gl_home / "controlplane.lock").stat().st_mode)[-3:] == "600"
        listed = gl("jobs", "--json")
        assert listed.returncode == 0, listed.stderr
        [job] = json.loads(listed.stdout)
        assert (job["spec"]["name"], job["state"]) == ("long", "running")
        cancel = gl("cancel", job["id"])
        # Either the cancel is confirmed, or the run (which hosts the control plane) exited on
        # its job's end before the confirmation went out; its exit status below says which.
        assert cancel.returncode == 0, cancel.stderr
        assert "cancelled" in cancel.stdout or "cancel requested" in cancel.stdout
        proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert _gone(child)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow  # ~6 s with two xdist workers on two cores
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


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_a_gpu_job_without_gpus_says_why_it_waits_and_ctrl_c_cancels_it(gl_home: Path) -> None:
    proc = subprocess.Popen(
        [*GL, "run", "--gpus", "1", "--wait", "--", "true"],  # --wait: it can never fit here
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


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
def test_explain_works_from_a_fresh_process(gl_home: Path) -> None:
    job_id = gl("run", "--detach", "--gpus", "1", "--wait", "--", "true").stdout.strip()
    out = gl("explain", job_id)
    assert out.returncode == 0
    assert "workers can run job" in out.stdout or "no workers" in out.stdout, out.stdout


# -- artifacts from the terminal (issue 12, item 13) ---------------------------------------------

WRITER = (
    "from gpulayer_kernel import job\n"
    "(job.output_dir() / 'report.txt').write_text('hello artifacts')\n"
)


@pytest.mark.slow  # ~9 s with two xdist workers on two cores
def test_artifacts_list_and_get(gl_home: Path, tmp_path: Path) -> None:
    assert gl("run", "--", sys.executable, "-c", WRITER).returncode == 0
    [job] = json.loads(gl("jobs", "--json").stdout)
    job_id = job["id"]
    listed = gl("artifacts", job_id)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:3] == ["report.txt", "15", "B"]
    got = gl("artifacts", job_id[:6], "--get", "report.txt", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "report.txt").read_text() == "hello artifacts"
    # An existing file is kept unless --force; -o names another place.
    (tmp_path / "report.txt").write_text("mine")
    kept = gl("artifacts", job_id, "--get", "report.txt", cwd=tmp_path)
    assert kept.returncode == 2 and "exists" in kept.stderr and "--force" in kept.stderr
    assert (tmp_path / "report.txt").read_text() == "mine"
    assert gl("artifacts", job_id, "--get", "report.txt", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "report.txt").read_text() == "hello artifacts"
    other = tmp_path / "sub" / "copy.txt"
    assert gl("artifacts", job_id, "--get", "report.txt", "-o", str(other)).returncode == 0
    assert other.read_text() == "hello artifacts"
    assert not [p for p in tmp_path.rglob("*.partial")]
    missing = gl("artifacts", job_id, "--get", "nope.bin", cwd=tmp_path)
    assert missing.returncode == 2 and "no artifact 'nope.bin'" in missing.stderr
    assert "report.txt" in missing.stderr and "Traceback" not in missing.stderr


TRAINER = """
import torch
from torch.utils.data import TensorDataset
from gpulayer_kernel.torch import Module, Trainer, TrainerConfig

class Tiny(Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
    def training_step(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
result = Trainer(TrainerConfig(max_steps=4, log_every=2)).fit(Tiny(), loader)
print("artifact", result.artifact)
"""


@pytest.mark.slow  # ~7 s with two xdist workers on two cores
def test_the_trainers_checkpoint_artifact_name_gets_the_file(gl_home: Path, tmp_path: Path) -> None:
    r = gl("run", "--", sys.executable, "-c", TRAINER, timeout=120)
    assert r.returncode == 0, r.stderr
    [said] = [line for line in r.stdout.splitlines() if line.startswith("artifact ")]
    name = said.split()[1]  # FitResult.artifact, as the docs' example prints it
    assert name == "step-00000004.pt"
    [job] = json.loads(gl("jobs", "--json").stdout)
    got = gl("artifacts", job["id"], "--get", name, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / name).stat().st_size > 0


# -- progress in the terminal (item 14) ----------------------------------------------------------

REPORTER = (
    "from gpulayer_kernel import job\n"
    "job.progress(step=5, total=10, loss=0.5, samples_per_s=41230.4, mfu=None)\n"
)


def test_run_shows_progress_for_people_when_not_a_tty(gl_home: Path) -> None:
    r = gl("run", "--", sys.executable, "-c", REPORTER)
    assert r.returncode == 0, r.stderr
    [line] = [line for line in r.stderr.splitlines() if "progress:" in line]
    assert line == "gpulayer: progress: step 5/10 (50%) · loss 0.5 · 41,230 samples/s"
    assert "None" not in r.stderr


def test_carriage_return_progress_prints_as_one_line(gl_home: Path) -> None:
    r = gl("run", "--", "sh", "-c", r"printf 'start\n\r 1/20\r 2/20\r20/20\ndone\n'")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "start\n20/20\ndone\n"


def test_live_line_redraws_in_place_on_a_tty_and_logs_scroll_above_it() -> None:
    from gpulayer_kernel.cli.live import ERASE, LiveLine

    from .test_render import make_job

    err = io.StringIO()
    live = LiveLine(err, tty=True)
    live.show(make_job(state=JobState.RUNNING, progress={"step": 1, "total": 4, "loss": 0.9}))
    live.show(make_job(state=JobState.RUNNING, progress={"step": 2, "total": 4, "loss": 0.5}))
    with live.above():
        err.write("a log line\n")
    live.close(make_job(state=JobState.SUCCEEDED, progress={"step": 4, "total": 4, "loss": 0.1}))
    assert err.getvalue() == (
        f"{ERASE}gpulayer: step 1/4 (25%) · loss 0.9"
        f"{ERASE}gpulayer: step 2/4 (50%) · loss 0.5"
        f"{ERASE}a log line\n"
        f"{ERASE}gpulayer: step 2/4 (50%) · loss 0.5"
        f"{ERASE}gpulayer: step 4/4 (100%) · loss 0.1\n"
    )


def test_live_line_prints_now_and_then_when_piped() -> None:
    from gpulayer_kernel.cli.live import LiveLine

    from .test_render import make_job

    now = [0.0]
    err = io.StringIO()
    live = LiveLine(err, tty=False, every=2.0, clock=lambda: now[0])
    for step in (1, 2, 3):
        live.show(make_job(progress={"step": step, "val_loss": 2.3}))
        now[0] += 1.5
    live.close(make_job(progress={"step": 4, "val_loss": 2.3}))
    assert err.getvalue().splitlines() == [
        "gpulayer: progress: step 1 · val_loss 2.3",
        "gpulayer: progress: step 3",
        "gpulayer: progress: step 4",
    ]


# -- small things (item 16) ----------------------------------------------------------------------


def test_lab_passes_jupyterlab_options_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer_kernel.cli import main

    started: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        started.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        main(["lab", "--no-browser", "--port", "8899"])
    assert started[0][1:3] == ["-m", "jupyterlab"]
    assert started[0][-3:] == ["--no-browser", "--port", "8899"]
    with pytest.raises(SystemExit):
        main(["lab", "mine.ipynb", "--ServerApp.token=x"])
    assert "mine.ipynb" in started[1] and "--ServerApp.token=x" in started[1]
    assert "01-quickstart" not in " ".join(started[1])


def test_lab_help_is_its_own(gl_home: Path) -> None:
    r = gl("lab", "--help")
    assert r.returncode == 0
    assert "usage: gpulayer lab" in r.stdout and "--no-browser" in r.stdout


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_a_closed_pipe_ends_quietly(gl_home: Path) -> None:
    for i in range(3):
        gl("run", "--detach", "--name", f"n{i}", "--", "true")
    proc = subprocess.Popen([*GL, "jobs"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the table is printed (as `| head -0`)
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_env_name_passes_the_shells_value_and_an_unset_one_is_named(gl_home: Path) -> None:
    env = {**os.environ, "GL_PASSED": "from the shell", "GL_NOT_PASSED": "hidden"}
    r = gl(
        "run",
        "--env",
        "GL_PASSED",
        "--",
        "sh",
        "-c",
        'echo "[$GL_PASSED] [$GL_NOT_PASSED]"',
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[from the shell] []\n"
    env.pop("GL_PASSED")
    unset = gl("run", "--env", "GL_PASSED", "--", "true", env=env)
    assert unset.returncode == 2
    assert "--env GL_PASSED: GL_PASSED is not set" in unset.stderr


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
def test_run_files_ships_a_bundle_and_runs_among_its_files(gl_home: Path, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "numbers.txt").write_text("1 2 3\n")
    (tmp_path / "show.py").write_text(
        "import os\n"
        "moved = os.getcwd() != os.environ['SUBMITTED_FROM']\n"
        "print(open('data/numbers.txt').read().strip(), moved)\n"
    )
    env = {**os.environ, "SUBMITTED_FROM": str(tmp_path)}
    r = gl(
        "run",
        "--env",
        "SUBMITTED_FROM",
        "--files",
        "show.py",
        "data",
        "--",
        sys.executable,
        "show.py",
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "1 2 3 True\n"
    [job] = json.loads(gl("jobs", "--json").stdout)
    assert job["spec"]["workload"]["bundle"] and job["spec"]["workdir"] is None
    both = gl("run", "--files", "show.py", "--workdir", "/tmp", "--", "true", cwd=tmp_path)
    assert both.returncode == 2 and "--workdir" in both.stderr
