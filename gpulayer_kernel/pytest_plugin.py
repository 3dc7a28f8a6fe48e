"""GPUlayer's pytest fixtures (``gl_`` prefix), for this project's tests and for extension authors.

Load it from a ``conftest.py``, as ``jupyter_server.pytest_plugin`` is loaded::

    pytest_plugins = ["gpulayer_kernel.pytest_plugin"]

Fixtures (docs/development.md shows them in use):

- ``gl_home``: an isolated ``GPULAYER_HOME``, no served control plane in the environment;
- ``gl_clock``: the clock ``gl_cp`` and ``gl_worker`` run on, the system clock unless the test is
  marked ``@pytest.mark.gl_fake_clock`` (then it is ``gl_fake_clock``);
- ``gl_fake_clock``: a :class:`~gpulayer_kernel.testing.FakeClock`, at the marker's ``start=``
  (wall seconds) if given;
- ``gl_cp``: a started :class:`~gpulayer_kernel.controlplane.ControlPlane` on a real SQLite file;
- ``gl_worker``: a factory of in-process workers on ``gl_cp`` (``await gl_worker("w1", gpus=2)``);
- ``gl_postgres``: one real PostgreSQL server per test session (skips where it is not installed).

Waiting without fixed sleeps: :func:`wait_until` (sync) and :func:`until` (async) return as soon
as a condition holds and raise ``TimeoutError`` after a deadline.

The async fixtures need pytest-asyncio (in auto or strict mode). Only the standard library,
pytest and pytest-asyncio are imported here: pytest loads this module in every run,
and the control plane (pydantic, the stores) costs ~300 ms that a run of unrelated tests should
not pay. The fixtures import what they start.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from .testing.clock import FakeClock
from .testing.waiting import until, wait_until

if TYPE_CHECKING:
    from .clock import Clock
    from .contracts import WorkerCapabilities
    from .controlplane import ControlPlane
    from .testing.postgres import PostgresServer
    from .worker.agent import WorkerAgent

__all__ = [
    "WorkerFactory",
    "gl_clock",
    "gl_cp",
    "gl_fake_clock",
    "gl_home",
    "gl_postgres",
    "gl_worker",
    "pid_alive",
    "sim_caps",
    "until",
    "wait_until",
]

FAKE_CLOCK_MARKER = "gl_fake_clock"

WorkerFactory = Callable[..., Awaitable["WorkerAgent"]]


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker, so that ``--strict-markers`` runs accept it."""
    config.addinivalue_line(
        "markers",
        f"{FAKE_CLOCK_MARKER}(start=None): gl_clock is a FakeClock (at wall time `start`), "
        "moved only by `await gl_clock.advance(seconds)`",
    )


@pytest.fixture
def gl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated GPULAYER_HOME with no served control plane in the environment."""
    home = tmp_path / "gpulayer-home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_SIMULATE_GPUS"):
        monkeypatch.delenv(var, raising=False)
    yield home


@pytest.fixture
def gl_fake_clock(request: pytest.FixtureRequest) -> FakeClock:
    """A FakeClock, at ``@pytest.mark.gl_fake_clock(start=...)``'s wall time where one is given."""
    marker = request.node.get_closest_marker(FAKE_CLOCK_MARKER)
    start = marker.kwargs.get("start") if marker is not None else None
    return FakeClock() if start is None else FakeClock(start=float(start))


@pytest.fixture
def gl_clock(request: pytest.FixtureRequest) -> Clock:
    """The clock ``gl_cp`` and ``gl_worker`` run on: the real one, or ``gl_fake_clock`` for a test
    (or module, by ``pytestmark``) marked ``@pytest.mark.gl_fake_clock`` — heartbeats, timers
    and long-polls then move only with ``await gl_clock.advance(seconds)``."""
    if request.node.get_closest_marker(FAKE_CLOCK_MARKER) is not None:
        clock: Clock = request.getfixturevalue("gl_fake_clock")
        return clock
    from .clock import SYSTEM_CLOCK

    return SYSTEM_CLOCK


@pytest_asyncio.fixture  # not pytest.fixture: also under pytest-asyncio's strict mode
async def gl_cp(tmp_path: Path, gl_clock: Clock) -> AsyncIterator[ControlPlane]:
    """A started ControlPlane on a real SQLite file, with a short heartbeat timeout (2 s)."""
    from .controlplane import ControlPlane
    from .store import LocalArtifactStore, SqliteStore

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
    """The capabilities of a worker with ``n`` simulated A100s (80 GB each)."""
    from .contracts import Device, WorkerCapabilities

    return WorkerCapabilities(
        devices=[
            Device(index=i, vendor="sim", name="Simulated A100", kind="a100", memory_bytes=80 << 30)
            for i in range(n)
        ],
        simulated=True,
    )


@pytest_asyncio.fixture
async def gl_worker(
    gl_cp: ControlPlane, gl_clock: Clock, tmp_path: Path
) -> AsyncIterator[WorkerFactory]:
    """In-process workers on ``gl_cp`` and its clock: ``await gl_worker(name="w1", gpus=2)``;
    other keywords go to the worker's ``ExecutorConfig``. All stop when the test ends."""
    from .contracts import WorkerCapabilities, WorkerRegistration
    from .worker.agent import WorkerAgent
    from .worker.executor import ExecutorConfig
    from .worker.transport import InProcessTransport

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
    from .testing.postgres import PostgresServer, find_bin

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
