"""An active and a standby ``gpulayer serve`` on one PostgreSQL database (real processes).

- kill -9 the leader under load: no acknowledged job is lost, none runs twice, every worker
  reconnects to the new leader, and the first job is accepted again within a few seconds;
- a paused leader resuming after the standby took over steps down before it writes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until
from gpulayer_kernel.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow


def shared_args(pg: PostgresServer, tmp_path: Path) -> tuple[str, ...]:
    db = pg.create_database()
    return ("--db", db, "--artifacts", str(tmp_path / "artifacts"), "--secrets-key",
            str(tmp_path / "secrets.key"))  # fmt: skip


def job(marker: Path, i: int) -> JobSpec:
    line = f'echo "$GPULAYER_JOB_ID" >> {marker}; sleep 0.3'
    return JobSpec(name=f"load-{i}", workload=CommandWorkload(argv=["sh", "-c", line]))


def test_killing_the_leader_under_load_loses_no_job_and_runs_none_twice(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    args = shared_args(gl_postgres, tmp_path)
    marker = tmp_path / "runs.txt"
    with ServeProcess(tmp_path / "a", heartbeat_timeout=15, args=args, standby=True) as a:
        a.wait_leading()
        with ServeProcess(tmp_path / "b", heartbeat_timeout=15, args=args, standby=True) as b:
            urls = f"{a.url},{b.url}"
            token = a.admin_token
            join = a.create_token("join")
            with (
                WorkerProcess(urls, join, name="w1", home=tmp_path / "w1") as w1,
                WorkerProcess(urls, join, name="w2", home=tmp_path / "w2") as w2,
                Client(urls, token) as client,
            ):
                acked: list[str] = []
                stop = threading.Event()
                errors: list[str] = []

                def load() -> None:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        try:
                            acked.append(client.submit(job(marker, i)).id)
                        except GPUlayerError as exc:  # in flight when the leader died
                            errors.append(exc.code)
                        time.sleep(0.02)  # a steady stream, not a flood, on 2 cores

                thread = threading.Thread(target=load)
                thread.start()
                try:
                    wait_until(lambda: len(acked) >= 15, timeout=60, what="15 jobs submitted")
                    a.kill()  # SIGKILL, no goodbye
                    killed_at, before = time.monotonic(), len(acked)
                    b.wait_leading(30)
                    wait_until(lambda: len(acked) > before, timeout=30, what="a job on b")
                    failover = time.monotonic() - killed_at
                    wait_until(lambda: len(acked) >= before + 10, timeout=60, what="more load")
                finally:
                    stop.set()
                    thread.join(30)
                for job_id in acked:
                    assert client.wait(job_id, timeout=90).state == JobState.SUCCEEDED, job_id
                runs = Counter(marker.read_text().split())
                assert all(runs[j] == 1 for j in acked), {j: runs[j] for j in acked if runs[j] != 1}
                assert set(runs) <= set(acked) | set(runs)  # refused submissions never ran twice
                assert max(runs.values()) == 1
                live = {w.id for w in client.workers() if w.live}
                assert {w1.worker_id, w2.worker_id} <= live  # both reconnected to b
                assert failover < 15, failover
                assert b.url in client.servers.url


def test_a_paused_leader_steps_down_before_writing(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    args = shared_args(gl_postgres, tmp_path)
    with ServeProcess(tmp_path / "a", args=args, standby=True) as a:
        a.wait_leading()
        with ServeProcess(tmp_path / "b", args=args, standby=True) as b:
            spec = JobSpec(name="before", workload=CommandWorkload(argv=["true"]))
            with Client(a.url, a.admin_token) as old:
                first = old.submit(spec)
                os.killpg(a.pid, signal.SIGSTOP)
                try:
                    b.wait_leading(30)  # its lease ran out: the standby leads
                    with Client(b.url, a.admin_token) as new:
                        second = new.submit(spec.model_copy(update={"name": "after"}))
                finally:
                    os.killpg(a.pid, signal.SIGCONT)
                # Resumed, it still answers, but it cannot write: refused, nothing stored.
                with pytest.raises(GPUlayerError) as info:
                    old.submit(spec.model_copy(update={"name": "from the old leader"}))
                assert info.value.code in ("not_leader", "server_unreachable")
            assert a.proc is not None and a.proc.wait(30) == 3  # it stepped down
            assert "lost the leadership" in a.output()
            with Client(b.url, a.admin_token) as new:
                names = sorted(j.spec.name for j in new.list())
                assert names == ["after", "before"]
                assert {j.id for j in new.list()} == {first.id, second.id}
