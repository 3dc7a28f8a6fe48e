"""An SSH fleet of two hosts, each a network namespace with its own sshd, joined to the control
plane's namespace by a veth pair: two jobs at once start a worker on each host, over real
interfaces, with TLS, and both workers are stopped when idle.

    netns cp (gpulayer serve, HTTPS)
      ├── veth 10.216.1.1/30 <──> 10.216.1.2/30  netns h1: sshd, then gpulayer worker box1
      └── veth 10.216.2.1/30 <──> 10.216.2.2/30  netns h2: sshd, then gpulayer worker box2

Every address lives only inside the namespaces this test creates (deleted afterwards), so two
runs on one machine never meet. Needs root (``ip netns``); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess
from gpulayer_kernel.testing import processes as spawning
from gpulayer_kernel.testing.slurm import free_ports
from gpulayer_kernel.testing.sshd import SSHServer

from .conftest import absent, ssh_config, ssh_host

pytestmark = [pytest.mark.netns, pytest.mark.slow]

PY = sys.executable
SCRIPT = """
import json, sys, time
from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, Resources
url, token, ca = sys.argv[1:4]
with Client(url, token, ca_cert=ca) as c:
    spec = JobSpec(
        workload=CommandWorkload(argv=[sys.executable, "-c", "import time; time.sleep(8)"]),
        resources=Resources(gpus=2), workdir="/tmp",
    )
    jobs = [c.submit(spec), c.submit(spec)]
    done = [c.wait(j.id, timeout=120) for j in jobs]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ended = c.instances(ended=True).instances
        if len(ended) == 2 and all(i.state.value == "terminated" for i in ended):
            break
        time.sleep(0.5)
    print(json.dumps({
        "jobs": [(d.state.value, d.history[0].workers[0]) for d in done],
        "instances": [(i.offer.id, i.state.value) for i in ended],
        "why": [(i.offer.id, i.state.value, i.reason) for i in ended],
    }))
"""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def three_namespaces() -> Iterator[tuple[str, str, str]]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces (CI runs as root)")
    tag = f"{os.getpid() % 100000}"
    cp, h1, h2 = f"gl-cp-{tag}", f"gl-h1-{tag}", f"gl-h2-{tag}"
    made: list[str] = []
    try:
        for ns in (cp, h1, h2):
            r = _ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        for i, host in ((1, h1), (2, h2)):
            a, b = f"glc{i}{tag}", f"glh{i}{tag}"  # at most 15 characters
            steps = [
                ("link", "add", a, "netns", cp, "type", "veth", "peer", "name", b, "netns", host),
                ("-n", cp, "addr", "add", f"10.216.{i}.1/30", "dev", a),
                ("-n", host, "addr", "add", f"10.216.{i}.2/30", "dev", b),
                ("-n", cp, "link", "set", a, "up"),
                ("-n", host, "link", "set", b, "up"),
                ("-n", host, "link", "set", "lo", "up"),
            ]
            for step in steps:
                r = _ip(*step)
                if r.returncode != 0:
                    pytest.skip(f"cannot set up a veth pair (ip {' '.join(step)}): {r.stderr}")
        _ip("-n", cp, "link", "set", "lo", "up")
        yield cp, h1, h2
    finally:
        for ns in made:
            _ip("netns", "del", ns)


def test_two_hosts_in_two_namespaces_each_get_a_worker_and_both_are_stopped(
    three_namespaces: tuple[str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_kernel.testing import sshd

    absent(sshd.missing())
    trustme = pytest.importorskip("trustme")
    cp, h1, h2 = three_namespaces
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "10.216.1.1", "10.216.2.1")
    ca_pem, cert_pem, key_pem = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    port = free_ports(1)[0]  # inside the fresh namespace any port is free; chosen at run time
    servers = [
        SSHServer(tmp_path / f"sshd-{i}", address=f"10.216.{i}.2", netns=ns)
        for i, ns in ((1, h1), (2, h2))
    ]
    try:
        for s in servers:
            s.start()
        known = tmp_path / "known_hosts"
        known.write_text("".join(s.known_hosts_line() + "\n" for s in servers))
        hosts = "".join(
            ssh_host(
                s,
                f"box{i}",
                s.root / "work",
                server_url=f"https://10.216.{i}.1:{port}",
                ca_cert=str(ca_pem),
            )
            for i, s in enumerate(servers, 1)
        )
        home = tmp_path / "home"
        home.mkdir()
        # 180 s to boot: with four xdist workers on two cores a worker's start waits for a core.
        config = ssh_config(known, hosts, idle_timeout=2, boot_timeout=180)
        (home / "providers.toml").write_text(config)
        tls = ("--host", "0.0.0.0", "--tls-cert", str(cert_pem), "--tls-key", str(key_pem))
        monkeypatch.setattr(
            spawning, "GL", ["ip", "netns", "exec", cp, PY, "-m", "gpulayer_kernel.cli"]
        )
        with ServeProcess(home, port=port, args=(*tls, "--ca-cert", str(ca_pem))) as server:
            monkeypatch.setattr(spawning, "GL", [PY, "-m", "gpulayer_kernel.cli"])
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
            env["GPULAYER_HOME"] = str(tmp_path / "client-home")
            out = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    cp,
                    PY,
                    "-c",
                    SCRIPT,
                    server.url,
                    server.admin_token,
                    str(ca_pem),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert out.returncode == 0, out.stdout + out.stderr + server.output()[-3000:]
            log = server.output()[-4000:]  # why an instance ended as it did, if one surprises
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert [state for state, _ in result["jobs"]] == ["succeeded", "succeeded"]
        workers = {w for _, w in result["jobs"]}
        assert len(workers) == 2 and all(w.startswith("fleet-") for w in workers)
        assert sorted(result["instances"]) == [
            ["fleet/box1", "terminated"],
            ["fleet/box2", "terminated"],
        ], f"{result['why']}\n{log}"  # a string: pytest shortens a tuple's repr
    finally:
        for s in servers:
            s.stop()
