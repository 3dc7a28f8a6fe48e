"""What a synced workspace costs (ADR 0022), beside what people would use instead, in one run.

    .venv/bin/python benchmarks/bench_workspace.py [--rounds N] [--files N] [--mb M]
        [--cells N] [--small-files N] [--quick]

Interleaved rounds (BENCHMARKING.md):

1. **First sync** of a folder of ``--files`` files and ``--mb`` MB (half random bytes, half CSV
   text, new content each round so nothing is deduplicated), from the Jupyter host to a worker
   that does not see the disk: GPUlayer (``gpulayer serve`` and ``gpulayer worker --host-id``,
   real processes, HTTP: the host's end uploads what the store lacks, the worker fetches and
   writes it) against ``rsync -a`` over SSH on loopback to an empty folder (``sshd`` as in
   ``gpulayer_kernel/testing/sshd.py``). Each round ends when the files are on the worker.
2. **A cell's round trip in a GPU kernel** (the provisioner, a real ipykernel on an in-process
   worker that pretends to be another machine) in a folder of ``--small-files`` files, as a
   notebook sees it (execute request → reply): with no workspace (the floor), synced with no
   change since the last cell, and synced after a one-line edit of ``helpers.py``. The added
   costs are the differences, per round.

The last line is ``first sync gpulayer/rsync ratio: R`` (below 1: faster than rsync).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import describe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_folder(root: Path, files: int, total: int, seed: int) -> None:
    rng = random.Random(seed)
    size = max(1, total // files)
    line = b"%d,%f,sensor-%d,ok\n"
    for i in range(files):
        path = root / f"d{i % 20:02}" / f"f{i:05}.{'bin' if i % 2 else 'csv'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if i % 2:
            data = rng.randbytes(size)
        else:
            rows = b"".join(line % (j, j * 0.5 + seed, j % 97) for j in range(size // 20 + 1))
            data = rows[:size]
        path.write_bytes(data)


# -- 1. first sync: gpulayer against rsync over ssh -----------------------------------------------


class Served:
    """``gpulayer serve`` and a worker that does not see the Jupyter host's disk."""

    def __init__(self, base: Path) -> None:
        from gpulayer_kernel.testing import ServeProcess, WorkerProcess

        self.server = ServeProcess(base / "cp").start()
        self.worker = WorkerProcess(
            self.server.url,
            self.server.create_token("join"),
            name="far",
            simulate_gpus=8,
            home=base / "far",
            args=("--host-id", "another-machine"),
            env={**os.environ, "GPULAYER_SESSION_PRELOAD": ""},
        ).start()

    def session(self, folder: Path, name: str) -> str:
        from gpulayer_kernel.contracts import JobState, SessionHolder, SessionSpec
        from gpulayer_kernel.contracts.jobs import Resources
        from gpulayer_kernel.contracts.workspace import WorkspaceSource
        from gpulayer_kernel.testing import wait_until
        from gpulayer_kernel.workspace.plan import host_id

        with self.server.client() as c:
            info = c.start_session(
                SessionSpec(
                    name=name,
                    resources=Resources(gpus=1),
                    holder=SessionHolder(client="bench"),
                    workspace=WorkspaceSource(folder=str(folder), host=host_id()),
                )
            )
            wait_until(lambda: c.get_session(info.id).job.state == JobState.RUNNING, 60)
            return info.id

    def stop_session(self, sid: str) -> None:
        with self.server.client() as c:
            c.stop_session(sid)

    async def first_sync(self, folder: Path, sid: str) -> float:
        from gpulayer_kernel.client.workspace import HttpWorkspaceLink
        from gpulayer_kernel.wire.http import Wire
        from gpulayer_kernel.workspace.host import HostWorkspace

        wire = Wire(self.server.url, self.server.admin_token, timeout=600)
        link = HttpWorkspaceLink(wire)
        ws = HostWorkspace(folder, sid, link)
        try:
            t0 = time.perf_counter()
            await ws.before_cell()
            return time.perf_counter() - t0
        finally:
            ws.close()
            await wire.aclose()

    def close(self) -> None:
        self.worker.stop()
        self.server.stop()


class Rsync:
    def __init__(self, base: Path) -> None:
        from gpulayer_kernel.testing.sshd import SSHServer

        self.sshd = SSHServer(base / "sshd").start()
        known = base / "known_hosts"
        known.write_text(self.sshd.known_hosts_line() + "\n")
        self.ssh = (
            f"ssh -p {self.sshd.port} -i {self.sshd.client_key} -o UserKnownHostsFile={known} "
            "-o BatchMode=yes -o IdentitiesOnly=yes"
        )

    def sync(self, folder: Path, dest: Path) -> float:
        t0 = time.perf_counter()
        subprocess.run(
            ["rsync", "-a", "-e", self.ssh, f"{folder}/", f"root@127.0.0.1:{dest}/"],
            check=True,
        )
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sshd.stop()


def first_sync(args: argparse.Namespace, base: Path) -> list[float]:
    if shutil.which("rsync") is None:
        print("rsync is missing (apt-get install -y rsync): part 1 skipped")
        return []
    served, rsync = Served(base), Rsync(base)
    ratios = []
    try:
        for r in range(args.rounds + 1):  # round 0 warms up
            folder = base / f"data-{r}"
            make_folder(folder, args.files, args.mb << 20, seed=r)
            subprocess.run(["sync"], check=True)
            sid = served.session(folder, f"bench-{r}")
            ours = asyncio.run(served.first_sync(folder, sid))
            served.stop_session(sid)
            theirs = rsync.sync(folder, base / f"rsync-dest-{r}")
            shutil.rmtree(base / f"rsync-dest-{r}")
            shutil.rmtree(folder)
            if r == 0:
                continue
            ratios.append(ours / theirs)
            print(
                f"  round {r}: gpulayer {ours * 1000:8.0f} ms   rsync -a over ssh "
                f"{theirs * 1000:8.0f} ms   ratio {ours / theirs:.2f}",
                flush=True,
            )
    finally:
        rsync.close()
        served.close()
    return ratios


# -- 2. a cell's round trip in a GPU kernel -------------------------------------------------------


async def cells(args: argparse.Namespace, base: Path) -> dict[str, list[float]]:
    from jupyter_client.manager import AsyncKernelManager

    from gpulayer_kernel.contracts import WorkerRegistration
    from gpulayer_kernel.contracts.workspace import WorkerShares
    from gpulayer_kernel.controlplane import ControlPlane
    from gpulayer_kernel.kernels import spec
    from gpulayer_kernel.kernels.host import host, use_link
    from gpulayer_kernel.kernels.link import CpLink
    from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
    from gpulayer_kernel.worker.agent import WorkerAgent
    from gpulayer_kernel.worker.config import ExecutorConfig
    from gpulayer_kernel.worker.transport import InProcessTransport
    from tests.conftest import sim_caps

    for var in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "IPYTHONDIR"):
        (base / var).mkdir(parents=True)
        os.environ[var] = str(base / var)
    os.environ["JUPYTER_PATH"] = str(base / "JUPYTER_DATA_DIR")
    os.environ["GPULAYER_HOME"] = str(base / "home")
    os.environ["GPULAYER_SESSION_PRELOAD"] = ""
    spec.install(gpus=1, gpu_kind=[], user=True, wait=60)
    h = host()

    async def up() -> tuple[ControlPlane, WorkerAgent]:
        store = SqliteStore(base / "cp.db")
        await store.open()
        cp = ControlPlane(store, LocalArtifactStore(base / "blobs"))
        await cp.start()
        agent = WorkerAgent(
            InProcessTransport(cp),
            WorkerRegistration(name="far", capabilities=sim_caps(4), shares=WorkerShares(host="x")),
            ExecutorConfig(work_root=base / "work"),
        )
        await agent.start()
        return cp, agent

    cp, agent = h.submit(up()).result(120)
    use_link(CpLink(cp))
    folder = base / "small"
    for i in range(args.small_files):
        p = folder / f"d{i % 100:02}" / f"f{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{i}\n")
    (folder / "helpers.py").write_text("VALUE = 0\n")
    plain = base / "plain"
    plain.mkdir()

    async def kernel(cwd: Path | None) -> tuple[Any, Any]:
        km = AsyncKernelManager(kernel_name="gpulayer-1gpu")
        await km.start_kernel(**({"cwd": str(cwd)} if cwd else {}))
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        return km, kc

    async def cell(kc: Any, code: str = "pass") -> float:
        t0 = time.perf_counter()
        reply = await kc.execute_interactive(code, timeout=60)
        took = time.perf_counter() - t0
        assert reply["content"]["status"] == "ok", reply
        return took

    floor_k = await kernel(None)  # no workspace: the kernel's own floor
    synced_k = await kernel(folder)
    await cell(synced_k[1], "import helpers")  # the first sync, then its outputs
    await asyncio.sleep(2.0)
    out: dict[str, list[float]] = {"floor": [], "no change": [], "one-line edit": []}
    hooks = synced_k[0].provisioner._workspace  # the relay's hooks (workspace/kernel.py)

    async def hook(edit: int | None) -> float:
        """(On the host loop.) The relay's wait before an execute request goes on."""
        if edit is not None:
            (folder / "helpers.py").write_text(f"VALUE = {edit}\n")
        t0 = time.perf_counter()
        await hooks.before_execute()
        return time.perf_counter() - t0

    try:
        for r in range(args.cells):
            out["floor"].append(await cell(floor_k[1]))
            out["no change"].append(await cell(synced_k[1]))
            (folder / "helpers.py").write_text(f"VALUE = {r}\n")
            out["one-line edit"].append(await cell(synced_k[1]))
            await asyncio.sleep(0.05)  # the last cell's outputs come back meanwhile
        out["hook, no change"] = [h.submit(hook(None)).result(60) for _ in range(args.cells * 10)]
        out["hook, one-line edit"] = [
            h.submit(hook(1000 + r)).result(60) for r in range(args.cells)
        ]
    finally:
        for km, kc in (floor_k, synced_k):
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

        async def down() -> None:
            await agent.stop()
            await cp.close()
            await cp.store.close()

        h._link = None
        h.submit(down()).result(60)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--cells", type=int, default=100)
    p.add_argument("--small-files", type=int, default=10_000)
    p.add_argument("--quick", action="store_true", help="2 rounds, 30 cells")
    p.add_argument("--only", choices=["sync", "cells"], default=None, help="one part only")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.cells = 2, 30
    print(f"bench_workspace on {describe()}")
    base = Path(tempfile.mkdtemp(prefix="gl-bench-ws-"))
    try:
        times = {} if args.only == "sync" else asyncio.run(cells(args, base / "cells"))
        if times:
            print(f"2. a cell in a GPU kernel, {args.small_files} files ({args.cells} cells)")
        floor = statistics.median(times["floor"]) if times else 0.0
        for name in ("no change", "one-line edit") if times else ():
            added = [t - f for t, f in zip(times[name], times["floor"], strict=True)]
            print(
                f"  cell, {name:14}: {statistics.median(times[name]) * 1000:7.2f} ms "
                f"(floor {floor * 1000:.2f} ms), added {statistics.median(added) * 1000:+.2f} ms "
                f"median of pairs"
            )
        for name in ("hook, no change", "hook, one-line edit") if times else ():
            ms = sorted(t * 1000 for t in times[name])
            print(
                f"  {name:20}: {statistics.median(ms):8.3f} ms median, "
                f"p90 {ms[int(len(ms) * 0.9)]:.3f} ms (the execute request waits this long)"
            )
        if args.only != "cells":
            print(f"1. first sync, {args.files} files / {args.mb} MB ({args.rounds} rounds)")
        (base / "sync").mkdir()
        ratios = [] if args.only == "cells" else first_sync(args, base / "sync")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if ratios:
        spread = f" (rounds {min(ratios):.2f}..{max(ratios):.2f})"
        print(f"first sync gpulayer/rsync ratio: {statistics.median(ratios):.2f}{spread}")


if __name__ == "__main__":
    main()
