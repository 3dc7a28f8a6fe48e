"""Instances belong to the cluster (issue 24, item 1): a second control plane on the same store
adopts the first one's machines, never fails one its provider reports running, and ends it idle.

The machines are ``FakeProvider``'s real ``gpulayer worker`` processes, their cloud's state shared
by both servers (``state_dir``), as a real cloud is; the store is one SQLite file the second
server opens after the first is killed (the PostgreSQL pair does the same on takeover).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.providers.fake import _marked
from gpulayer_kernel.testing import ServeProcess, kill_homes_under, wait_until

pytestmark = pytest.mark.slow

CONFIG = """
[autoscale]
idle_timeout = 2
reconcile_every = 0.5

[providers.fake]
kind = "fake"
boot_seconds = 0.2
max_instances = 1
state_dir = "{cloud}"

[[providers.fake.offers]]
name = "a100x1"
gpus = 1
gpu_kind = "a100"
price_per_hour = 2.0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ServeProcess, ServeProcess, Path]]:
    """Two servers of one cluster (one store, one cloud, each other's URLs); not started."""
    cloud = tmp_path / "cloud"
    ports = free_port(), free_port()
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    db = f"sqlite://{tmp_path / 'cluster.db'}"
    key = tmp_path / "secrets.key"  # one key for the pair, as deploy.md says
    key.write_text(base64.urlsafe_b64encode(os.urandom(32)).decode() + "\n")
    key.chmod(0o600)
    servers = []
    for name, port in zip("ab", ports, strict=True):
        home = tmp_path / name
        home.mkdir()
        (home / "providers.toml").write_text(CONFIG.format(cloud=cloud))
        args = ("--db", db, "--artifacts", str(tmp_path / "blobs"), "--secrets-key", str(key))
        args += ("--cluster-urls", urls)
        servers.append(ServeProcess(home, port=port, heartbeat_timeout=5, args=args))
    try:
        yield servers[0], servers[1], cloud
    finally:
        for s in servers:
            s.stop()
        kill_homes_under(cloud)  # its machines outlive the servers, as real ones would


def machines(cloud: Path) -> list[dict[str, object]]:
    return list(json.loads((cloud / "fake-fake.json").read_text()))


def test_a_new_leader_adopts_the_killed_leader_s_machine_runs_its_job_once_and_ends_it(
    pair: tuple[ServeProcess, ServeProcess, Path], tmp_path: Path
) -> None:
    a, b, cloud = pair
    runs = tmp_path / "runs.txt"
    a.start()
    urls = f"{a.url},http://127.0.0.1:{b.port}"
    with Client(urls, a.admin_token) as c:
        job = c.submit(
            JobSpec(
                workload=CommandWorkload(argv=["sh", "-c", f"echo run >> {runs}; sleep 8"]),
                resources=Resources(gpus=1),
                retries=2,  # a machine wrongly failed would run it again: counted below
            )
        )
        wait_until(lambda: c.get(job.id).state == JobState.RUNNING, 60, what="the job to run")
        (launched,) = machines(cloud)
        assert str(launched["server_url"]) == urls  # its worker can follow a failover
        a.kill()  # kill -9: no goodbye
        killed = time.monotonic()
        b.start()
        c.get(job.id)  # the client moves to b on its own
        failover = time.monotonic() - killed
        wait_until(lambda: c.get(job.id).state.terminal, 60, what="the job to end")
        done = c.get(job.id)
        (inst,) = c.instances(ended=True).instances
        wait_until(
            lambda: c.instances(ended=True).instances[0].state.value == "terminated",
            30,
            what="the idle machine to end",
        )
        ended = c.instances(ended=True).instances[0]
    print(f"failover as the client saw it (b started after the kill): {failover:.1f}s")
    assert done.state == JobState.SUCCEEDED, done
    assert runs.read_text().count("run") == 1  # 0 double runs
    assert inst.id == launched["instance_id"] and inst.state.value != "failed", inst
    assert ended.reason == "idle" or "idle" in (ended.reason or ""), ended
    (rec,) = machines(cloud)
    assert rec["state"] == "ended"
    wait_until(
        lambda: not _marked(int(str(rec["pid"])), str(rec["external_id"])),
        15,
        what="the machine's worker to exit",
    )
    assert "differs" not in b.output()  # same providers.toml: nothing to say
