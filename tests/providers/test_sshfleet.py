"""``SSHFleetProvider`` against a real OpenSSH server on loopback: host keys verified (an unknown
or changed key refused, saying which), GPUlayer installed when missing, workers started with a
single-use token and stopped; end to end through a ``gpulayer serve``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.errors import ConfigInvalid, ProviderError
from gpulayer_kernel.providers import LaunchSpec, SSHFleetProvider, parse_config
from gpulayer_kernel.providers.config import SSHSettings
from gpulayer_kernel.testing import GL, ServeProcess, wait_until
from gpulayer_kernel.testing.sshd import SSHServer, keygen

from .conftest import VENV, run_two_gpu_job, ssh_config, ssh_host
from .conftest import served as serving

pytestmark = pytest.mark.slow


def fleet(server: SSHServer, known: Path, work: Path, **host: Any) -> SSHFleetProvider:
    cfg = parse_config(
        {
            "providers": {
                "fleet": {
                    "kind": "ssh",
                    "known_hosts": str(known),
                    "hosts": [
                        {
                            "name": "box1",
                            "address": server.address,
                            "port": server.port,
                            "key": str(server.client_key),
                            "gpus": 2,
                            "simulate": True,
                            "price_per_gpu_hour": 0.9,
                            "venv": str(host.pop("venv", VENV)),
                            "work_dir": str(work),
                            **host,
                        }
                    ],
                }
            }
        }
    )
    s = cfg.providers["fleet"]
    assert isinstance(s, SSHSettings)
    return SSHFleetProvider(s, owner="t00010")


def known_hosts(tmp: Path, *lines: str) -> Path:
    path = tmp / "known_hosts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


async def test_the_host_key_is_verified_and_gpulayer_found(
    gl_sshd: SSHServer, tmp_path: Path
) -> None:
    p = fleet(gl_sshd, known_hosts(tmp_path, gl_sshd.known_hosts_line()), tmp_path / "w")
    check = await p.check()
    assert check.ok, check.detail
    assert "box1: reachable, host key verified, GPUlayer " in check.detail
    [offer] = check.offers
    assert (offer.id, offer.gpus, offer.price_per_hour, offer.capacity) == ("fleet/box1", 2, 1.8, 1)


async def test_a_changed_host_key_is_refused_saying_so(gl_sshd: SSHServer, tmp_path: Path) -> None:
    other = keygen(tmp_path / "impostor").split()[:2]
    entry = gl_sshd.known_hosts_line().split()[0]
    p = fleet(gl_sshd, known_hosts(tmp_path, f"{entry} {other[0]} {other[1]}"), tmp_path / "w")
    with pytest.raises(ProviderError) as info:
        await p.launch((await p.offers())[0], "glt_i_x", LaunchSpec("0" * 12, "w", "http://x"))
    err = info.value
    assert err.code == "host_key_refused"
    assert "presented a host key that is not the one in" in err.message and "changed" in err.message
    assert "check its new key out of band" in err.hint
    check = await p.check()
    assert not check.ok and "host key" in check.detail


async def test_an_unknown_host_key_is_refused_no_blind_trust(
    gl_sshd: SSHServer, tmp_path: Path
) -> None:
    p = fleet(gl_sshd, known_hosts(tmp_path), tmp_path / "w")
    with pytest.raises(ProviderError, match="no blind trust") as info:
        await p.launch((await p.offers())[0], "glt_i_x", LaunchSpec("0" * 12, "w", "http://x"))
    assert f"ssh-keyscan -p {gl_sshd.port} 127.0.0.1" in info.value.hint
    census = await p.instances()
    assert census.unlisted == frozenset({"fleet/box1"}) and "no blind trust" in census.errors[0]
    missing = fleet(gl_sshd, tmp_path / "no-such-file", tmp_path / "w")
    with pytest.raises(ConfigInvalid, match="known_hosts"):
        await missing.launch((await p.offers())[0], "t", LaunchSpec("0" * 12, "w", "http://x"))


async def test_gpulayer_is_installed_when_missing_then_a_worker_starts_and_stops(
    gl_sshd: SSHServer, tmp_path: Path
) -> None:
    known = known_hosts(tmp_path, gl_sshd.known_hosts_line())
    venv = tmp_path / "remote-venv"
    # The host's install command, run only because {venv} has no GPUlayer: here a link to a
    # venv that has it (a pip install from PyPI is the default).
    p = fleet(gl_sshd, known, tmp_path / "w", venv=venv, install=f"ln -sfn {VENV} {{venv}}")
    offer = (await p.offers())[0]
    how = LaunchSpec("0123456789ab", "box1-test", "http://127.0.0.1:9")
    external = await p.launch(offer, "glt_i_000000000000_secret", how)
    assert venv.is_symlink() and external.startswith("box1:")
    [found] = (await p.instances()).reported
    assert (found.instance_id, found.state) == ("0123456789ab", "running")
    workdir = tmp_path / "w" / "gpulayer-t00010-0123456789ab"
    assert not (workdir / "token").exists()  # read and deleted by the worker's shell
    environ = Path(f"/proc/{external.split(':')[1]}/environ").read_bytes()
    cmdline = Path(f"/proc/{external.split(':')[1]}/cmdline").read_bytes()
    assert b"glt_i_000000000000_secret" in environ and b"glt_i_" not in cmdline
    await p.terminate("0123456789ab", external)
    assert (await p.instances()).reported == ()
    broken = fleet(gl_sshd, known, tmp_path / "w", venv=tmp_path / "nothing", install="false")
    with pytest.raises(ProviderError, match=r"installing GPUlayer .* on box1 failed \(exit 1\)"):
        await broken.launch(offer, "glt_i_x", how)


@pytest.fixture
def served(tmp_path: Path, gl_sshd: SSHServer) -> Iterator[ServeProcess]:
    known = known_hosts(tmp_path, gl_sshd.known_hosts_line())
    host = ssh_host(gl_sshd, "box1", gl_sshd.root / f"work-{os.getpid()}-{tmp_path.name}")
    with serving(tmp_path, ssh_config(known, host)) as server:
        yield server


def test_a_two_gpu_job_with_no_worker_starts_one_over_ssh_runs_and_it_is_stopped(
    served: ServeProcess, tmp_path: Path
) -> None:
    env = run_two_gpu_job(served, tmp_path)
    with served.client() as c:
        [job] = c.list()
        [attempt] = job.history
        assert attempt.provider == "fleet" and attempt.unit_price == 0.9
        wait_until(
            lambda: c.instances(ended=True).instances[0].state.value == "terminated",
            60,
            what="the idle SSH worker to be stopped",
        )
        wait_until(lambda: c.workers() == [], 30, what="its worker to leave")
    costs = subprocess.run(
        [*GL, "costs", "--by", "provider"], env=env, capture_output=True, text=True, timeout=60
    )
    assert costs.returncode == 0 and "fleet" in costs.stdout, costs.stdout + costs.stderr
