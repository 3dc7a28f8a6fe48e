"""Issue 32, item 3: a restored copy of the database never ends the live cluster's machines.

On a real PostgreSQL and Slurm 22.05: a leader runs a job on a Slurm machine it launched; its
database is backed up and restored into a new database (docs/operations.md's own example), and
a ``gpulayer serve`` is started on the copy with the same providers.toml. The copy kept the
cluster id, so it called the live cluster's batch job a stray and cancelled it every round
("unknown to this control plane: ending it"): both live jobs ended ``lost``. Now the copy gets a
cluster id of its own, the machines it recorded as live are left running as the original's, and
a ``scancel`` names this cluster's job name besides the job id. ``--as-original`` keeps the id,
and is refused while the original's leader holds its lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.store.backup_pg import schema_and_rows
from gpulayer_kernel.testing import GL, ServeProcess, wait_until
from gpulayer_kernel.testing.postgres import PostgresServer
from gpulayer_kernel.testing.slurm import SlurmCluster

pytestmark = pytest.mark.slow


def gl(*argv: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp / "cli-home")
    return subprocess.run([*GL, *argv], env=env, capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def server(tmp: Path, name: str, db: str, config: str) -> Iterator[ServeProcess]:
    home = tmp / name
    home.mkdir()
    (home / "providers.toml").write_text(config)
    args = ("--db", db, "--artifacts", str(tmp / f"{name}-blobs"))
    args += ("--secrets-key", str(tmp / "secrets.key"))
    with ServeProcess(home, heartbeat_timeout=10, args=args) as s:
        yield s


def batch_jobs(cluster: SlurmCluster) -> dict[str, str]:
    out = cluster.run("squeue", "-h", "-o", "%i %T").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_a_restored_copy_leaves_the_live_cluster_s_machines_alone(
    gl_postgres: PostgresServer, gl_slurm: SlurmCluster, tmp_path: Path
) -> None:
    config = gl_slurm.provider_toml(idle_timeout=300)
    live_db = gl_postgres.create_database()
    with server(tmp_path, "live", live_db, config) as live, live.client() as c:

        def running_job() -> str:
            spec = JobSpec(
                workload=CommandWorkload(argv=["sleep", "300"]), resources=Resources(gpus=1)
            )
            job = c.submit(spec)
            wait_until(lambda: c.get(job.id).state == JobState.RUNNING, 90, what="a job to run")
            return job.id

        first = running_job()  # on a machine the backup records
        backup = gl("db", "backup", str(tmp_path / "bk"), "--db", live_db, tmp=tmp_path)
        assert backup.returncode == 0, backup.stderr
        second = running_job()  # on a machine launched after the backup: unknown to a copy
        machines = {i.id: str(i.external_id) for i in c.instances().instances}
        assert len(machines) == 2
        assert all(batch_jobs(gl_slurm).get(j) == "RUNNING" for j in machines.values())

        copy_db = gl_postgres.create_database()
        restore = gl("db", "restore", str(tmp_path / "bk"), "--db", copy_db, tmp=tmp_path)
        assert restore.returncode == 0, restore.stderr

        with server(tmp_path, "copy", copy_db, config) as copy:
            copy.admin_token = live.admin_token  # the copy holds the same tokens
            # Twenty reconciler rounds (every 0.25 s) on the copy, with the same providers.toml:
            # its first round used to cancel the live batch job it did not know. Nothing is
            # expected to change, so there is no event to wait for but the time.
            time.sleep(5.0)
            jobs = batch_jobs(gl_slurm)
            assert all(jobs.get(j) == "RUNNING" for j in machines.values()), copy.output()
            assert "unknown to this control plane" not in copy.output()
            with copy.client() as cc:
                (mirrored,) = cc.instances(ended=True).instances
            assert mirrored.id in machines and mirrored.state.value == "terminated"
            assert "left running" in (mirrored.reason or ""), mirrored
        for job_id in (first, second):
            assert c.get(job_id).state == JobState.RUNNING  # the live cluster's jobs run on
        assert "restored as a copy: new cluster id" in restore.stderr

        # As the original, while the original still leads: refused, nothing restored.
        third = gl_postgres.create_database()
        refused = gl(
            "db", "restore", str(tmp_path / "bk"), "--db", third, "--as-original", tmp=tmp_path
        )
        assert refused.returncode != 0
        assert "original_still_leads" in refused.stderr or "--as-original" in refused.stderr
        assert "stop the original's servers first" in refused.stderr, refused.stderr
        _, rows = asyncio.run(schema_and_rows(third))
        assert not any(rows.values()), rows
        for job_id in (first, second):
            c.cancel(job_id)
    # The original stopped: --as-original is taken, and the cluster id kept.
    again = gl("db", "restore", str(tmp_path / "bk"), "--db", third, "--as-original", tmp=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "cluster id kept" in again.stderr
