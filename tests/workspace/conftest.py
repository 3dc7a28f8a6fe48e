"""Workspaces end to end: a real KernelManager and the provisioner (as ``tests/kernels``), a
control plane on the kernels' host loop, and workers that see the notebook's folder (in place)
or pretend to be another machine (``WorkerShares(host=...)``: synced)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import WorkerCapabilities, WorkerRegistration
from gpulayer_kernel.contracts.workspace import WorkerShares
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.kernels import spec
from gpulayer_kernel.kernels.host import host, use_link
from gpulayer_kernel.kernels.link import CpLink
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport

from ..conftest import sim_caps
from ..kernels.conftest import Plane
from ..kernels.conftest import _provisioner_registered as _provisioner_registered

FAR = "another-machine"


def add_worker(plane: Plane, name: str, gpus: int, shares: WorkerShares | None) -> WorkerAgent:
    async def start() -> WorkerAgent:
        caps = sim_caps(gpus) if gpus else WorkerCapabilities()
        agent = WorkerAgent(
            InProcessTransport(plane.cp),
            WorkerRegistration(name=name, capabilities=caps, shares=shares),
            ExecutorConfig(work_root=plane.root / f"work-{name}"),
            clock=plane.cp.clock,
            heartbeat_interval=0.5,
        )
        await agent.start()
        return agent

    agent: WorkerAgent = plane.call(start())
    plane.workers[name] = agent
    return agent


def make_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plane:
    for var in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "IPYTHONDIR"):
        (tmp_path / var).mkdir()
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "JUPYTER_DATA_DIR"))
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "")
    spec.install(gpus=1, gpu_kind=[], user=True, wait=20)
    h = host()

    async def up() -> ControlPlane:
        store = SqliteStore(tmp_path / "cp.db")
        await store.open()
        cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"), heartbeat_timeout=2.0)
        await cp.start()
        return cp

    cp = h.submit(up()).result(60)
    use_link(CpLink(cp))
    return Plane(h, cp, {}, tmp_path)


def close_plane(plane: Plane) -> None:
    async def down() -> None:
        for agent in plane.workers.values():
            await agent.stop()
        await plane.cp.close()
        await plane.cp.store.close()

    plane.host._link = None
    plane.host.submit(down()).result(60)


@pytest.fixture
def gl_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plane]:
    """A control plane whose one worker is 'another machine': workspaces are synced."""
    plane = make_plane(tmp_path, monkeypatch)
    add_worker(plane, "far", 2, WorkerShares(host=FAR))
    try:
        yield plane
    finally:
        close_plane(plane)


@pytest.fixture
def gl_near(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plane]:
    """A control plane whose one worker runs on this machine: workspaces are in place."""
    plane = make_plane(tmp_path, monkeypatch)
    add_worker(plane, "near", 2, None)
    try:
        yield plane
    finally:
        close_plane(plane)


def notebook_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "data.csv").write_text("a,b\n1,2\n3,4\n")
    (folder / "helpers.py").write_text("VALUE = 1\n\ndef total(rows):\n    return sum(rows)\n")
    (folder / "analysis.ipynb").write_text("{}")
    return folder


def gated(started: Path, go: Path, then: str) -> str:
    """A cell's code that creates ``started`` (outside the synced folder), waits for ``go``, then
    runs ``then``: a test acts while the cell runs on the worker, after its folder's sync."""
    return (
        f"import os, time\nopen({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n{then}"
    )
