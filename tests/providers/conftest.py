"""Real engines for the provider tests: one Slurm 22.05 and one sshd per test session.

Each starts once, on ports and in a directory chosen at run time, and is stopped at the end
(slurmd before slurmctld). Where the binaries are missing the tests skip saying what to
install; in CI (``CI`` set, where ``install.sh --dev`` installs them) missing is a failure.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import GL, ServeProcess, slurm, sshd

VENV = Path(sys.executable).parent.parent  # this interpreter's venv: GPUlayer is in it


def absent(why: str | None) -> None:
    if why is None:
        return
    if os.environ.get("CI"):  # CI installs them (install.sh --dev): missing is a failure there
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def gl_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm.SlurmCluster]:
    absent(slurm.missing())
    with slurm.SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


# Many hosts' shells talk on stderr as they start (pyenv's rehash did, on a CI host, and a
# worker's pid was read wrong): this one does, on every command, a number in its words.
NOISY_SHELL = "echo \"rm: cannot remove '/root/.pyenv/shims/tmp.$$': No such file\" >&2\n"


@pytest.fixture(scope="session")
def gl_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.SSHServer]:
    absent(sshd.missing())
    root = tmp_path_factory.mktemp("sshd")
    (root / "noisy.sh").write_text(NOISY_SHELL)
    with sshd.SSHServer(root, env={"BASH_ENV": str(root / "noisy.sh")}) as server:
        yield server


@contextlib.contextmanager
def served(tmp: Path, config: str) -> Iterator[ServeProcess]:
    """A ``gpulayer serve`` whose home holds ``config`` as its providers.toml."""
    home = tmp / "home"
    home.mkdir()
    (home / "providers.toml").write_text(config)
    with ServeProcess(home, heartbeat_timeout=5) as server:
        yield server


def client_env(server: ServeProcess, tmp: Path) -> dict[str, str]:
    """The environment of a ``gpulayer`` command that talks to ``server``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(server.client_env(), GPULAYER_HOME=str(tmp / "client-home"))
    return env


def run_two_gpu_job(server: ServeProcess, tmp: Path) -> dict[str, str]:
    """``gpulayer run --gpus 2`` of a script printing its rank, with no worker running: it
    must start one, run both ranks and end 0. Returns the client environment used."""
    env = client_env(server, tmp)
    code = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"
    run = subprocess.run(
        [*GL, "run", "--gpus", "2", "--workdir", str(tmp), "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rank 0 of 2" in run.stdout and "rank 1 of 2" in run.stdout
    return env


def ssh_host(server: sshd.SSHServer, name: str, work: Path, **extra: object) -> str:
    lines = [
        "[[providers.fleet.hosts]]",
        f'name = "{name}"',
        f'address = "{server.address}"',
        f"port = {server.port}",
        f'key = "{server.client_key}"',
        "gpus = 2",
        'gpu_kind = "a100"',
        "gpu_memory_gb = 80",
        "simulate = true",
        "price_per_gpu_hour = 0.90",
        f'venv = "{extra.pop("venv", VENV)}"',
        f'work_dir = "{work}"',
    ]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def ssh_config(
    known_hosts: Path, hosts: str, *, idle_timeout: float = 2, boot_timeout: float = 60
) -> str:
    return f"""
[autoscale]
idle_timeout = {idle_timeout}
reconcile_every = 0.5
boot_timeout = {boot_timeout}

[providers.fleet]
kind = "ssh"
known_hosts = "{known_hosts}"
boot_seconds = 3
{hosts}"""
