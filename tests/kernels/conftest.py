"""GPU kernels end to end: a real ``jupyter_client`` KernelManager, the provisioner, a control
plane on the provisioners' host loop (SQLite file) and a real in-process worker with simulated
GPUs; the kernel is a real ipykernel process on that worker, its messages relayed.

The provisioner's entry point is read from the installed package's metadata; an editable install
made before it existed lacks it, so it is added to jupyter_client's factory here when missing.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import WorkerCapabilities, WorkerRegistration
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.kernels import spec
from gpulayer_kernel.kernels.host import Host, host, use_link
from gpulayer_kernel.kernels.link import CpLink
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport

from ..conftest import sim_caps

EP_GROUP = "jupyter_client.kernel_provisioners"


@pytest.fixture(scope="session", autouse=True)
def _provisioner_registered() -> None:
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    if spec.PROVISIONER not in factory.provisioners:
        factory.provisioners[spec.PROVISIONER] = importlib.metadata.EntryPoint(
            name=spec.PROVISIONER,
            value="gpulayer_kernel.kernels.provisioner:GPUlayerProvisioner",
            group=EP_GROUP,
        )


@dataclass
class Plane:
    host: Host
    cp: ControlPlane
    workers: dict[str, WorkerAgent]
    root: Path

    def call(self, coro: Any, timeout: float = 60.0) -> Any:
        """Run ``coro`` on the host loop (where the control plane lives) and wait for it."""
        return self.host.submit(coro).result(timeout)

    def add_worker(self, name: str, gpus: int) -> WorkerAgent:
        async def start() -> WorkerAgent:
            caps = sim_caps(gpus) if gpus else WorkerCapabilities()
            agent = WorkerAgent(
                InProcessTransport(self.cp),
                WorkerRegistration(name=name, capabilities=caps),
                ExecutorConfig(work_root=self.root / f"work-{name}"),
                clock=self.cp.clock,
                heartbeat_interval=0.5,
            )
            await agent.start()
            return agent

        agent: WorkerAgent = self.call(start())
        self.workers[name] = agent
        return agent


@pytest.fixture
def gl_kernelspecs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jupyter's folders under ``tmp_path``, holding the 1-, 2- and 4-GPU kernel specs."""
    for var in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "IPYTHONDIR"):
        (tmp_path / var).mkdir()
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "JUPYTER_DATA_DIR"))
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "")
    for gpus in (1, 2):
        spec.install(gpus=gpus, gpu_kind=[], user=True, wait=20)
    spec.install(gpus=4, gpu_kind=[], user=True, wait=1.5, name="gpulayer-4gpu")


@pytest.fixture
def gl_plane(gl_kernelspecs: None, tmp_path: Path) -> Iterator[Plane]:
    """A control plane with worker ``w1`` (2 simulated GPUs) on the kernels' host loop, and
    a Jupyter data dir holding the 1- and 2-GPU kernel specs."""
    h = host()

    async def up() -> ControlPlane:
        store = SqliteStore(tmp_path / "cp.db")
        await store.open()
        cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"), heartbeat_timeout=2.0)
        await cp.start()
        return cp

    cp = h.submit(up()).result(60)
    plane = Plane(h, cp, {}, tmp_path)
    plane.add_worker("w1", 2)
    use_link(CpLink(cp))
    try:
        yield plane
    finally:

        async def down() -> None:
            for agent in plane.workers.values():
                await agent.stop()
            await cp.close()
            await cp.store.close()

        h._link = None
        h.submit(down()).result(60)
        assert os.environ.get("GPULAYER_HOME")


async def restarter_rounds(km: Any, n: int) -> None:
    """Return once jupyter_client's restarter (every ``time_to_dead`` = 3 s) has asked the kernel
    ``n`` times whether it is alive: what it would have started by then, it has."""
    asked = 0
    real = km.is_alive

    async def counted() -> bool:
        nonlocal asked
        asked += 1
        return await real()

    km.is_alive = counted  # type: ignore[method-assign]  # the restarter looks it up each round
    try:
        await until(lambda: asked >= n, 3.0 * n + 30, what=f"{n} rounds of the restarter")
    finally:
        del km.is_alive
