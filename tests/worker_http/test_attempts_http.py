"""Attempts with real processes: ``gpulayer serve`` and a ``gpulayer worker`` paused with SIGSTOP
past the heartbeat timeout, then resumed with SIGCONT (issue 12, item 2); and a secret canary that
a job returns and reports as progress (item 4, both layers)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
from gpulayer_kernel.testing import GL, ServeProcess, WorkerProcess, wait_until

pytestmark = pytest.mark.slow
HEARTBEAT = 2.0
CANARY = "canary-5e1d77b0c3a9"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def attempt_script(pids: Path) -> list[str]:
    """Attempt 0 writes its pid and sleeps on; any later attempt writes its pid and succeeds."""
    script = (
        f'echo $$ > {pids}.$GPULAYER_ATTEMPT; [ "$GPULAYER_ATTEMPT" = 0 ] && exec sleep 120; exit 0'
    )
    return ["sh", "-c", script]


def pid_of(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip(), 30, what=f"{path} written")
    return int(path.read_text())


@contextlib.contextmanager
def paused(worker: WorkerProcess) -> Iterator[None]:
    """SIGSTOP the worker (its jobs run on in their own sessions); SIGCONT on the way out."""
    worker.kill(signal.SIGSTOP)
    try:
        yield
    finally:
        worker.kill(signal.SIGCONT)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServeProcess, WorkerProcess]]:
    with ServeProcess(tmp_path / "home", heartbeat_timeout=HEARTBEAT) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=tmp_path / "w1") as worker:
            yield server, worker


def test_a_paused_worker_s_job_ends_through_its_next_attempt(
    served: tuple[ServeProcess, WorkerProcess], tmp_path: Path
) -> None:
    server, worker = served
    pids = tmp_path / "pid"
    with server.client() as c:
        job = c.submit(
            JobSpec(workload=CommandWorkload(argv=attempt_script(pids)), retries=1, retry_backoff=0)
        )
        pid0 = pid_of(Path(f"{pids}.0"))
        wait_until(lambda: c.get(job.id).state == JobState.RUNNING, 30, what="attempt 0 running")
        with paused(worker):
            # Past the heartbeat timeout: attempt 0 is lost and the job goes round again.
            wait_until(lambda: c.get(job.id).attempts == 1, 30, what="attempt 0 declared lost")
        # The worker comes back, is handed attempt 1, stops attempt 0 and runs attempt 1.
        wait_until(lambda: c.get(job.id).state.terminal, 60, what="the job to end")
        done = c.get(job.id)
        assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1), [
            (a.attempt, a.outcome, a.reason, a.retried) for a in done.history
        ]
        wait_until(lambda: not alive(pid0), 30, what="attempt 0's process to be stopped")
        assert worker.alive()  # a refused stale report is no crash
        texts = [r.text for r in c.logs(job.id).records]
        assert any(t.startswith("attempt 1 failed (worker w1 was lost") for t in texts), texts


def test_cancel_ends_the_job_between_attempts_and_the_stale_process_stops(
    served: tuple[ServeProcess, WorkerProcess], tmp_path: Path
) -> None:
    server, worker = served
    pids = tmp_path / "pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(server.client_env(), GPULAYER_HOME=str(tmp_path / "client-home"))
    with server.client() as c:
        job = c.submit(
            JobSpec(workload=CommandWorkload(argv=attempt_script(pids)), retries=1, retry_backoff=0)
        )
        pid0 = pid_of(Path(f"{pids}.0"))
        with paused(worker):
            wait_until(lambda: c.get(job.id).attempts == 1, 30, what="attempt 0 declared lost")
            # Attempt 1 waits for a worker; `gpulayer cancel` ends the job there and then.
            r = subprocess.run(
                [*GL, "cancel", job.id], env=env, capture_output=True, text=True, timeout=60
            )
            assert r.returncode == 0, r.stderr
            assert c.get(job.id).state == JobState.CANCELLED
        # Back from its pause, the worker is told to stop what it ran; nothing runs again.
        wait_until(lambda: not alive(pid0), 30, what="attempt 0's process to be stopped")
        assert c.get(job.id).state == JobState.CANCELLED
        assert not Path(f"{pids}.1").exists()


def test_a_secret_a_job_returns_or_reports_is_never_stored_or_served(
    served: tuple[ServeProcess, WorkerProcess],
) -> None:
    server, _ = served
    probe = (
        "import json, os, sys\n"
        "v = os.environ['CANARY']\n"
        "with open(os.environ['GPULAYER_CONTROL'], 'w') as f:\n"
        "    f.write(json.dumps({'kind': 'progress', 'fields': {'tok': v, 'n': [v]}}) + '\\n')\n"
        "with open(os.environ['GPULAYER_RESULT'], 'w') as f:\n"
        "    json.dump({'env': v}, f)\n"
    )
    with server.client() as c:
        c.set_secret("CANARY", CANARY)
        since = c.events().next_since
        spec = JobSpec(
            workload=CommandWorkload(argv=[sys.executable, "-c", probe]), secrets=["CANARY"]
        )
        job = c.submit(spec)
        done = c.wait(job.id, timeout=60)
        assert done.state == JobState.SUCCEEDED, done
        assert done.result == {"env": "***"}
        assert CANARY not in done.model_dump_json()
        assert CANARY not in c.events(since=since).model_dump_json()
        assert all(CANARY not in j.model_dump_json() for j in c.list())
        # Nor in the store's rows of the job and its log (the secret's own row holds the value).
        [db] = [p for p in server.home.rglob("*.db") if p.is_file()]
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows = conn.execute("SELECT body FROM jobs").fetchall()
            rows += conn.execute("SELECT text FROM logs").fetchall()
        assert rows and not [r for r in rows if CANARY in r[0]]
