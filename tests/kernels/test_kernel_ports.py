"""The worker's end of a GPU kernel's ports: the connection file goes out with every port 0,
and the ports are read back once the kernel process has bound them and written them in (a port
picked free here and bound by the kernel a second later could be taken meanwhile)."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
from pathlib import Path

from gpulayer_kernel.contracts.kernels import KernelConnection
from gpulayer_kernel.worker.sessions.kernel import PORTS, bound_ports, write_unbound

# A kernel starting: the file names no port for a while, then every port it bound.
WRITES_PORTS = """
import json, sys, time
path, names = sys.argv[1], sys.argv[2].split(",")
info = json.load(open(path))
time.sleep(0.2)
open(path, "w").write(json.dumps({**info, **{p: 40000 + i for i, p in enumerate(names)}}))
time.sleep(5)
"""


async def _run(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, *argv)


async def test_the_ports_are_read_back_once_the_kernel_wrote_them(tmp_path: Path) -> None:
    path = tmp_path / "kernel-1.json"
    write_unbound(path, KernelConnection(key="k" * 32))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the signing key
    sent = json.loads(path.read_text())
    assert sent["key"] == "k" * 32 and all(sent[p] == 0 for p in PORTS)
    proc = await _run("-c", WRITES_PORTS, str(path), ",".join(PORTS))
    try:
        info = await bound_ports(path, proc)
        assert info is not None and [info[p] for p in PORTS] == [40000 + i for i in range(5)]
        assert info["key"] == "k" * 32
    finally:
        proc.kill()
        await proc.wait()


async def test_a_kernel_that_exits_before_it_binds_gives_no_ports(tmp_path: Path) -> None:
    path = tmp_path / "kernel-1.json"
    write_unbound(path, KernelConnection(key="k" * 32))
    proc = await _run("-c", "raise SystemExit(3)")
    assert await asyncio.wait_for(bound_ports(path, proc), 30) is None
    assert proc.returncode == 3
