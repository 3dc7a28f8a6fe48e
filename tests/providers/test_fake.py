"""``FakeProvider`` with its real machines: ``gpulayer worker`` processes on this host, launched
by a ``gpulayer serve``'s autoscaler, joining with single-use instance tokens; the CLI lists
them, their costs and the provider's own bill."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.testing import GL, ServeProcess, kill_homes_under, wait_until

pytestmark = pytest.mark.slow

CONFIG = """
[autoscale]
idle_timeout = 2
reconcile_every = 0.5

[costs]
gpu_hour = 1.5

[providers.fake]
kind = "fake"
boot_seconds = 0.2
max_instances = 2

[[providers.fake.offers]]
name = "a100x2"
gpus = 2
gpu_kind = "a100"
price_per_hour = 4.2
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServeProcess]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "providers.toml").write_text(CONFIG)
    try:
        with ServeProcess(home, heartbeat_timeout=5) as server:
            yield server
    finally:
        kill_homes_under(home)  # its machines outlive it, as real ones would


def test_fake_machines_are_real_workers_and_the_cli_shows_them_and_their_costs(
    served: ServeProcess, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(served.client_env(), GPULAYER_HOME=str(tmp_path / "client-home"))

    def gl(*args: str) -> str:
        r = subprocess.run([*GL, *args], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    with served.client() as c:
        job = c.submit(
            JobSpec(
                workload=CommandWorkload(argv=["sleep", "1"]),
                resources=Resources(gpus=1),
                labels={"project": "vision"},
            )
        )
        wait_until(lambda: c.get(job.id).state == JobState.SUCCEEDED, 60, what="the job")
        listed = gl("providers", "instances", "--all")
        assert "fake/a100x2" in listed and "fake-" in listed
        wait_until(
            lambda: c.instances(ended=True).instances[0].state.value == "terminated",
            30,
            what="the idle machine to end",
        )
    by_user = gl("costs", "--by", "user")  # the job's owner: the served admin's client token
    assert "admin" in by_user and "total" in by_user
    assert "vision" in gl("costs", "--by", "project")
    by_provider = gl("costs", "--by", "provider", "--since", "1h")
    assert "BILLED" in by_provider and "fake" in by_provider
    attempts = gl("show", job.id, "--attempts")
    assert "succeeded" in attempts and "fake-" in attempts and "(fake)" in attempts
    providers = gl("providers")
    assert "fake/a100x2: 2× a100 80 GiB, 2 CPUs, $4.20/h" in providers
    assert "autoscaling: on" in providers
