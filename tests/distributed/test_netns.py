"""Two workers in two network namespaces joined by a veth pair: the rendezvous crosses a real
network interface, not loopback.

    netns A (10.213.0.1/30)                         netns B (10.213.0.2/30)
    gpulayer serve (HTTPS, private CA)   <──veth──>  gpulayer worker wb
    gpulayer worker wa                               torchrun (node 0 or 1)
    torchrun (node 0 or 1)

The addresses exist only on the veths this test creates; both namespaces are deleted afterwards.
Needs root (``ip netns``); skipped with the reason where that is unavailable.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess, WorkerProcess
from gpulayer_kernel.testing import processes as spawning

from .conftest import PY, ROOT, needs_torch

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.torch, needs_torch]

ADDR_A, ADDR_B = "10.213.0.1", "10.213.0.2"  # a private test range, on our veths only


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _netns_unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


@pytest.fixture
def two_namespaces() -> Iterator[tuple[str, str, str]]:
    """(netns A, netns B, veth name in B), joined by a veth pair; deleted afterwards."""
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"gl-a-{tag}", f"gl-b-{tag}"
    veth_a, veth_b = f"glva{tag}", f"glvb{tag}"  # interface names: at most 15 characters
    made: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            r = _ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        steps = [
            (
                "link",
                "add",
                veth_a,
                "netns",
                ns_a,
                "type",
                "veth",
                "peer",
                "name",
                veth_b,
                "netns",
                ns_b,
            ),
            ("-n", ns_a, "addr", "add", f"{ADDR_A}/30", "dev", veth_a),
            ("-n", ns_b, "addr", "add", f"{ADDR_B}/30", "dev", veth_b),
            ("-n", ns_a, "link", "set", veth_a, "up"),
            ("-n", ns_b, "link", "set", veth_b, "up"),
            ("-n", ns_a, "link", "set", "lo", "up"),
            ("-n", ns_b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            r = _ip(*step)
            if r.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(step)}): {r.stderr}")
        yield ns_a, ns_b, veth_b
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and the pair
            _ip("netns", "del", ns)


@contextlib.contextmanager
def inside(monkeypatch: pytest.MonkeyPatch, ns: str) -> Iterator[None]:
    """Start the next ServeProcess/WorkerProcess inside netns ``ns`` (``ip netns exec``)."""
    base = [PY, "-m", "gpulayer_kernel.cli"]
    # Patched where ServeProcess/WorkerProcess read it (the package only re-exports it).
    monkeypatch.setattr(spawning, "GL", ["ip", "netns", "exec", ns, *base])
    try:
        yield
    finally:
        monkeypatch.setattr(spawning, "GL", base)


def _tx_bytes(ns: str, dev: str) -> int:
    out = _ip("-n", ns, "-s", "-j", "link", "show", dev).stdout
    m = re.search(r'"tx":\{"bytes":(\d+)', out)
    return int(m.group(1)) if m else 0


@pytest.mark.usefixtures("no_leftovers")
def test_allreduce_across_two_namespaces_over_a_veth_pair(
    two_namespaces: tuple[str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trustme = pytest.importorskip("trustme")
    ns_a, ns_b, veth_b = two_namespaces
    ca = trustme.CA()
    cert = ca.issue_cert(ADDR_A)
    ca_pem, cert_pem, key_pem = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    cert.private_key_pem.write_to_path(str(key_pem))

    tls = (
        "--host",
        ADDR_A,
        "--tls-cert",
        str(cert_pem),
        "--tls-key",
        str(key_pem),
        "--ca-cert",
        str(ca_pem),
    )
    server = ServeProcess(tmp_path / "home", heartbeat_timeout=5, args=tls)
    workers: list[WorkerProcess] = []
    try:
        with inside(monkeypatch, ns_a):
            server.start()
        assert server.url.startswith(f"https://{ADDR_A}:")
        client_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")},
            "GPULAYER_URL": server.url,
            "GPULAYER_TOKEN": server.admin_token,
            "GPULAYER_CA_CERT": str(ca_pem),
            "GPULAYER_HOME": str(tmp_path / "client-home"),
        }

        def in_a(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["ip", "netns", "exec", ns_a, PY, "-m", "gpulayer_kernel.cli", *argv],
                cwd=ROOT,
                env=client_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )

        made = in_a("token", "create", "--kind", "join", "--ttl", "10m")
        assert made.returncode == 0, made.stderr
        join = made.stdout.strip()
        for name, ns, addr in (("wa", ns_a, ADDR_A), ("wb", ns_b, ADDR_B)):
            w = WorkerProcess(
                server.url,
                join,
                name=name,
                simulate_gpus=1,
                home=tmp_path / name,
                args=("--advertise-addr", addr, "--ca-cert", str(ca_pem)),
            )
            with inside(monkeypatch, ns):
                w.start()
            workers.append(w)

        before = _tx_bytes(ns_b, veth_b)
        done = in_a(
            "run",
            "--nodes",
            "2",
            "--gpus",
            "1",
            "--",
            "python",
            "examples/allreduce.py",
            timeout=100,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout.splitlines()
        assert "[rank 0] rank 0: sum = 3" in out and "[rank 1] rank 1: sum = 3" in out
        meet = re.findall(r"node (\d) of 2\), rendezvous at ([\d.]+):(\d+)", done.stderr)
        assert sorted(n for n, _, _ in meet) == ["0", "1"], done.stderr
        ((addr, port),) = {(a, p) for _, a, p in meet}  # both nodes met at one address...
        assert addr in (ADDR_A, ADDR_B)  # ...a veth address, published by rank 0's worker
        # The ranks' traffic crossed the veth pair (gloo, the store, and the control plane's).
        # ~10 KB: torchrun's own log lines no longer travel (they stay on the worker unless the
        # job sets GPULAYER_LAUNCHER_LOGS=1); a loopback-only run sends none of it.
        assert _tx_bytes(ns_b, veth_b) - before > 5_000
    finally:
        for w in workers:
            w.stop()
        server.stop()
