"""Shared fixtures (``gl_`` prefix): real SQLite stores, real control planes, real workers.

What must hold for every path pytest is given (``pytest notebooks`` too: a notebook's cells on
one xdist worker, the probe cache, the process reaper) lives in the root ``conftest.py``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.clock import SYSTEM_CLOCK, Clock
from gpulayer_kernel.contracts import Device, WorkerCapabilities, WorkerRegistration
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing.postgres import PostgresServer, find_bin
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport


@pytest.fixture
def gl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated GPULAYER_HOME with no served control plane in the environment."""
    home = tmp_path / "gpulayer-home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_SIMULATE_GPUS"):
        monkeypatch.delenv(var, raising=False)
    yield home


@pytest.fixture
def gl_clock() -> Clock:
    """The clock ``gl_cp`` runs on: the real one; a module overrides this fixture to hand in a
    ``FakeClock`` and drive heartbeats, timers and long-polls by hand."""
    return SYSTEM_CLOCK


@pytest.fixture
async def gl_cp(tmp_path: Path, gl_clock: Clock) -> AsyncIterator[ControlPlane]:
    """A started ControlPlane on a real SQLite file, with a short heartbeat timeout."""
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(
        store, LocalArtifactStore(tmp_path / "blobs"), clock=gl_clock, heartbeat_timeout=2.0
    )
    await cp.start()
    yield cp
    await cp.close()
    await store.close()


def sim_caps(n: int) -> WorkerCapabilities:
    return WorkerCapabilities(
        devices=[
            Device(index=i, vendor="sim", name="Simulated A100", kind="a100", memory_bytes=80 << 30)
            for i in range(n)
        ],
        simulated=True,
    )


WorkerFactory = Callable[..., Awaitable[WorkerAgent]]


@pytest.fixture
async def gl_worker(
    gl_cp: ControlPlane, gl_clock: Clock, tmp_path: Path
) -> AsyncIterator[WorkerFactory]:
    """In-process workers on ``gl_cp`` and its clock: ``await gl_worker(name="w1", gpus=2)``."""
    agents: list[WorkerAgent] = []

    async def start(name: str = "w1", gpus: int = 0, **config: object) -> WorkerAgent:
        caps = sim_caps(gpus) if gpus else WorkerCapabilities()
        agent = WorkerAgent(
            InProcessTransport(gl_cp),
            WorkerRegistration(name=name, capabilities=caps),
            ExecutorConfig(work_root=tmp_path / f"work-{name}", **config),  # type: ignore[arg-type]
            clock=gl_clock,
            heartbeat_interval=0.5,
        )
        await agent.start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        await agent.stop()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="session")
def gl_postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole test session (free port, scratch folder).

    Skips where PostgreSQL is not installed (``apt-get install postgresql``; ``install.sh --dev``
    does it as root), except in CI, where a missing server is a failure.
    """
    if find_bin() is None:
        message = "PostgreSQL is not installed (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("asyncpg")
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
