"""Issue 32, item 2: ``kill -9`` of the leader while it launches an SSH fleet machine.

An active and a standby ``gpulayer serve`` on one real PostgreSQL database, an SSH fleet of one
host (a real sshd on loopback), a job with no worker to run it: the leader launches a machine,
and is killed at a moment in the middle of that launch, either as the machine's worker starts
(the case that leaked: the worker was started, the launch call had not returned) or at a random
moment after the instance's folder appears on the host. The standby takes over and must

- run the job once (adopting the machine, or launching another if none started),
- know where every machine runs (the host was recorded before anything started on it, and the
  id the host reports is learnt): no instance without an external id,
- end every machine once idle, through the provider (its folder marked ended, its worker gone).

Before the fix the adopted instance had no host recorded, its end was a no-op and its worker
lived on, looping on its revoked token.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.testing import wait_until
from gpulayer_kernel.testing.postgres import PostgresServer
from gpulayer_kernel.testing.sshd import SSHServer

from ..conftest import pid_alive
from .conftest import ssh_config, ssh_host
from .test_failover_real import pair

pytestmark = pytest.mark.slow


def _pid(folder: Path) -> int | None:
    try:
        text = (folder / "worker.pid").read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


@pytest.mark.parametrize("moment", ["as-its-worker-starts", "random"])
def test_kill_9_of_the_leader_mid_launch_leaves_no_machine_running(
    gl_postgres: PostgresServer, gl_sshd: SSHServer, tmp_path: Path, moment: str
) -> None:
    rng = random.Random()
    known = tmp_path / "known_hosts"
    known.write_text(gl_sshd.known_hosts_line() + "\n")
    work = gl_sshd.root / f"work-{os.getpid()}-{tmp_path.name}"
    config = ssh_config(known, ssh_host(gl_sshd, "box1", work), idle_timeout=2)
    runs = tmp_path / "runs.txt"

    with (
        pair(gl_postgres, tmp_path, config) as (a, b),
        Client(f"{a.url},{b.url}", a.admin_token) as c,
    ):
        job = c.submit(
            JobSpec(
                workload=CommandWorkload(argv=["sh", "-c", f"echo run >> {runs}; sleep 1"]),
                resources=Resources(gpus=1),
                retries=2,
                retry_backoff=0,
            )
        )

        def folders() -> list[Path]:
            return sorted(work.glob("gpulayer-*")) if work.is_dir() else []

        wait_until(folders, 60, what="the launch to reach the host")
        if moment == "random":
            time.sleep(rng.uniform(0.0, 0.6))  # before, during or after the worker's start
        else:
            wait_until(lambda: _pid(folders()[0]) is not None, 30, what="the worker to start")
        a.kill()  # SIGKILL mid-launch: no goodbye
        print(f"killed the leader {moment}: worker started={_pid(folders()[0]) is not None}")

        wait_until(lambda: c.get(job.id).state.terminal, 120, what="the job to end on b")
        done = c.get(job.id)
        assert done.state == JobState.SUCCEEDED, done
        wait_until(
            lambda: all(i.state.ended for i in c.instances(ended=True).instances),
            90,
            what="every machine to be ended once idle",
        )
        instances = c.instances(ended=True).instances
    assert runs.read_text().count("run") == 1  # 0 double runs
    assert instances, "no machine was launched"
    for inst in instances:
        if inst.launched_at is not None or inst.worker_id is not None:
            # A machine that started is known by its host (and pid, once its listing said it).
            assert inst.external_id and inst.external_id.startswith("box1"), inst
    started = [f for f in folders_of(work) if _pid(f) is not None]
    assert started, list(work.iterdir())
    for folder in started:
        pid = _pid(folder)
        assert pid is not None
        wait_until(lambda pid=pid: not pid_alive(pid), 30, what=f"worker {pid} to stop")  # type: ignore[misc]
        # Ended through the provider (the folder's mark), not only by the worker's own exit.
        assert (folder / "ended").exists(), (folder, (folder / "worker.log").read_text()[-2000:])


def folders_of(work: Path) -> list[Path]:
    return sorted(work.glob("gpulayer-*"))
