"""What a GPU kernel costs (ADR 0021), beside a local ipykernel and a session cell, in one run.

    .venv/bin/python benchmarks/bench_kernel.py [--rounds N] [--calls N]

Everything runs on the embedded path: a control plane and a worker with 2 simulated GPUs on the
kernels' host loop in this process (as when the Jupyter server opens it), the GPU kernel a real
ipykernel process on that worker, driven by ``jupyter_client`` through the provisioner.

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=20, help="cells per path per round")
    args = p.parse_args()
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

    paths = {"local kernel": lambda: local.run(CELL), "GPU kernel": lambda: gpu.run(CELL)}
    paths["session cell"] = session_cell
    for fn in paths.values():
        for _ in range(5):
            fn()
    per: dict[str, list[float]] = {k: [] for k in paths}
    diffs, ratios = [], []
    for _ in range(args.rounds):
        this: dict[str, float] = {}
        for name, fn in paths.items():
            this[name] = statistics.median(fn() for _ in range(args.calls))
            per[name].append(this[name])
        diffs.append(this["GPU kernel"] - this["local kernel"])
        ratios.append(this["GPU kernel"] / this["local kernel"])
    for name, values in per.items():
        ms = [v * 1000 for v in values]
        spread = f"{min(ms):.2f}–{max(ms):.2f}"
        print(f"trivial cell, {name}: {statistics.median(ms):.2f} ms p50 (rounds {spread})")
    gpu.close()
    local.close()
    h.submit(agent.stop()).result(60)
    d = statistics.median(diffs) * 1000
    print(
        f"gpu kernel cell over local: {d:+.2f} ms (target <= 5 ms), "
        f"ratio {statistics.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
