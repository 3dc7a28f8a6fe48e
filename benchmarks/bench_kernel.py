"""What a GPU kernel costs (ADR 0021), beside a local ipykernel and a session cell, in one run.

    .venv/bin/python benchmarks/bench_kernel.py [--path embedded|lab|served] [--rounds N]

``--path embedded`` (the default): a control plane and a worker with 2 simulated GPUs on the
kernels' host loop in this process, the GPU kernel a real ipykernel process on that worker, driven
by ``jupyter_client`` through the provisioner.

``--path lab``: what ``gpulayer lab`` runs — a real Jupyter server with GPUlayer's extension (its
control plane and local worker inside the server), both kernels started through
``POST /api/kernels`` and driven over Jupyter's kernel WebSocket from outside, as JupyterLab does.

``--path served``: the same Jupyter server without a control plane of its own, pointed at a real
``gpulayer serve`` (``GPULAYER_URL``) with a separate ``gpulayer worker`` process: the kernel's
messages go Jupyter server → control plane → worker and back over their streams.

1. **Start to first result**: ``KernelManager.start_kernel`` → ready → ``1 + 1`` answered, for the
   GPU kernel (queue, placement, the worker's ipykernel start, the relay) and a local ipykernel.
2. **A trivial cell** (``x = 1``), from the execute request to the kernel going idle on iopub, as a
   notebook sees it, in interleaved rounds: the local kernel (the floor), the GPU kernel, and a
   session cell on the same control plane through the embedded Python API (``run_cell``).

The last line is ``gpu kernel cell over local: +D ms (target <= 5 ms), ratio R``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

CELL = "x = 1"


class Kernel:
    """A kernel driven as a notebook frontend drives it (blocking client)."""

    def __init__(self, name: str) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 60.0) -> float:
        """Seconds from the execute request until the kernel is idle again (errors raise)."""
        msg_id = self.kc.execute(code, allow_stdin=False)
        start = time.perf_counter()
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                raise RuntimeError(f"cell failed: {msg['content']['evalue']}")
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return time.perf_counter() - start

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def setup(root: Path) -> Any:
    """Jupyter dirs, the kernel spec, the provisioner, and the control plane with its worker."""
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (root / name).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(root / name)
    os.environ["GPULAYER_HOME"] = str(root / "home")
    os.environ["GPULAYER_SESSION_PRELOAD"] = ""
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    from gpulayer_kernel.contracts import (
        Device,
        WorkerCapabilities,
        WorkerRegistration,
    )
    from gpulayer_kernel.controlplane import ControlPlane
    from gpulayer_kernel.kernels import spec
    from gpulayer_kernel.kernels.host import host, use_link
    from gpulayer_kernel.kernels.link import CpLink
    from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
    from gpulayer_kernel.worker.agent import WorkerAgent
    from gpulayer_kernel.worker.config import ExecutorConfig
    from gpulayer_kernel.worker.transport import InProcessTransport

    spec.install(gpus=1, gpu_kind=[], user=True, wait=60)
    factory = KernelProvisionerFactory.instance()
    if spec.PROVISIONER not in factory.provisioners:  # an editable install from before it
        factory.provisioners[spec.PROVISIONER] = importlib.metadata.EntryPoint(
            name=spec.PROVISIONER,
            value="gpulayer_kernel.kernels.provisioner:GPUlayerProvisioner",
            group="jupyter_client.kernel_provisioners",
        )
    h = host()

    async def up() -> tuple[ControlPlane, WorkerAgent]:
        store = SqliteStore(root / "cp.db")
        await store.open()
        cp = ControlPlane(store, LocalArtifactStore(root / "blobs"))
        await cp.start()
        devices = [
            Device(index=i, vendor="sim", name="Simulated A100", kind="a100", memory_bytes=80 << 30)
            for i in range(2)
        ]
        agent = WorkerAgent(
            InProcessTransport(cp),
            WorkerRegistration(
                name="w1", capabilities=WorkerCapabilities(devices=devices, simulated=True)
            ),
            ExecutorConfig(work_root=root / "work"),
        )
        await agent.start()
        return cp, agent

    cp, agent = h.submit(up()).result(120)
    use_link(CpLink(cp))
    return h, cp, agent


def interleaved(
    paths: dict[str, Any], rounds: int, calls: int, base: str, gpu: str
) -> tuple[float, float]:
    """Rounds of ``calls`` cells per path (A B A B …); prints each path's p50 and spread, and
    returns the medians of the per-round difference and ratio of ``gpu`` over ``base``."""
    for fn in paths.values():
        for _ in range(5):
            fn()
    per: dict[str, list[float]] = {k: [] for k in paths}
    diffs, ratios = [], []
    for _ in range(rounds):
        this: dict[str, float] = {}
        for name, fn in paths.items():
            this[name] = statistics.median(fn() for _ in range(calls))
            per[name].append(this[name])
        diffs.append(this[gpu] - this[base])
        ratios.append(this[gpu] / this[base])
    for name, values in per.items():
        ms = [v * 1000 for v in values]
        spread = f"{min(ms):.2f}–{max(ms):.2f}"
        print(f"trivial cell, {name}: {statistics.median(ms):.2f} ms p50 (rounds {spread})")
    return statistics.median(diffs) * 1000, statistics.median(ratios)


def over_jupyter(path: str, rounds: int, calls: int) -> None:
    """The ``lab`` and ``served`` paths: a real Jupyter server, its kernels driven from outside."""
    import asyncio

    from _jupyter import JupyterServer, WsKernel, isolated_env

    from gpulayer_kernel.testing import ServeProcess, WorkerProcess

    root = Path(tempfile.mkdtemp(prefix=f"gl-bench-kernel-{path}-"))
    served: ServeProcess | None = None
    worker: WorkerProcess | None = None
    if path == "served":
        clean = isolated_env(root / "serve-env")
        served = ServeProcess(root / "served", heartbeat_timeout=30, env=clean).start()
        join = served.create_token("join", ttl=3600)
        worker = WorkerProcess(
            served.url, join, name="wk", simulate_gpus=1, home=root / "wk", env=clean
        ).start()
        env = isolated_env(root, GPULAYER_URL=served.url, GPULAYER_TOKEN=served.admin_token)
    else:
        env = isolated_env(root, GPULAYER_SIMULATE_GPUS="1")
    import subprocess

    subprocess.run(
        [sys.executable, "-m", "gpulayer_kernel.cli", "kernelspec", "install", "--gpus", "1",
         "--user", "--wait", "120"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    server = JupyterServer(root, env, extension=path == "lab").start()
    loop = asyncio.new_event_loop()
    try:
        local, gpu = WsKernel(server, "python3"), WsKernel(server, "gpulayer-1gpu")
        local_start = loop.run_until_complete(local.start())
        gpu_start = loop.run_until_complete(gpu.start())
        print(f"start to first result: local ipykernel {local_start * 1000:.0f} ms, ")
        print(
            f"  GPU kernel (queue, placement, worker's ipykernel, relay) {gpu_start * 1000:.0f} ms"
        )
        paths = {
            "local kernel": lambda: loop.run_until_complete(local.run(CELL)),
            "GPU kernel": lambda: loop.run_until_complete(gpu.run(CELL)),
        }
        d, r = interleaved(paths, rounds, calls, "local kernel", "GPU kernel")
        loop.run_until_complete(gpu.close())
        loop.run_until_complete(local.close())
    finally:
        server.stop()
        if worker is not None:
            worker.stop()
        if served is not None:
            served.stop()
        loop.close()
    print(f"gpu kernel cell over local ({path} path): {d:+.2f} ms (target <= 2 ms), ratio {r:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", choices=("embedded", "lab", "served"), default="embedded")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=20, help="cells per path per round")
    args = p.parse_args()
    if args.path != "embedded":
        print(f"machine: {describe()}; load {os.getloadavg()[0]:.2f}")
        over_jupyter(args.path, args.rounds, args.calls)
        return
    root = Path(tempfile.mkdtemp(prefix="gl-bench-kernel-"))
    h, cp, agent = setup(root)
    from gpulayer_kernel.contracts import (
        CellRequest,
        Resources,
        SessionHolder,
        SessionSpec,
        SessionStatus,
    )

    print(f"machine: {describe()}")
    t = time.perf_counter()
    local = Kernel("python3")
    local.run("1 + 1")
    local_start = time.perf_counter() - t
    t = time.perf_counter()
    gpu = Kernel("gpulayer-1gpu")
    gpu.run("1 + 1")
    gpu_start = time.perf_counter() - t
    print(f"start to first result: local ipykernel {local_start * 1000:.0f} ms, ")
    print(f"  GPU kernel (queue, placement, worker's ipykernel, relay) {gpu_start * 1000:.0f} ms")

    holder = SessionHolder(client="bench")
    spec = SessionSpec(name="bench", holder=holder, resources=Resources(gpus=1))
    h.submit(cp.start_session(spec)).result(60)
    deadline = time.monotonic() + 120
    while h.submit(cp.get_session("bench")).result(10).status != SessionStatus.IDLE:
        if time.monotonic() > deadline:
            sys.exit("the session did not come up")
        time.sleep(0.1)

    def session_cell() -> float:
        start = time.perf_counter()
        page = h.submit(cp.run_cell("bench", CellRequest(code=CELL, client="bench"), 30)).result()
        assert page.cell.state.done, page.cell
        return time.perf_counter() - start

    paths: dict[str, Any] = {
        "local kernel": lambda: local.run(CELL),
        "GPU kernel": lambda: gpu.run(CELL),
        "session cell": session_cell,
    }
    d, r = interleaved(paths, args.rounds, args.calls, "local kernel", "GPU kernel")
    gpu.close()
    local.close()
    h.submit(agent.stop()).result(60)
    print(
        f"gpu kernel cell over local (embedded path): {d:+.2f} ms (target <= 2 ms), ratio {r:.2f}"
    )


if __name__ == "__main__":
    main()
