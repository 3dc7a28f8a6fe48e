"""The embedded default: a ControlPlane on SQLite under ``$GPULAYER_HOME`` and a local worker.

No server to start: ``gpulayer run``, plain IPython and tests open one of these in-process. It
takes the state directory's lock for as long as it lives.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import TracebackType

from .contracts import WorkerCapabilities, WorkerRegistration
from .controlplane import ControlPlane
from .home import Layout, StateLock, home_dir
from .store import LocalArtifactStore, SqliteStore
from .worker.agent import WorkerAgent
from .worker.executor import ExecutorConfig
from .worker.transport import InProcessTransport

SIMULATE_ENV = "GPULAYER_SIMULATE_GPUS"
SIMULATE_KIND_ENV = "GPULAYER_SIMULATE_KIND"


async def local_capabilities(
    simulate_gpus: int | None = None, simulate_kind: str | None = None
) -> WorkerCapabilities:
    """This machine's capabilities: simulated GPUs when asked, else the isolated probe's."""
    from . import capabilities

    if simulate_gpus is None and os.environ.get(SIMULATE_ENV):
        simulate_gpus = int(os.environ[SIMULATE_ENV])
    simulate_kind = simulate_kind or os.environ.get(SIMULATE_KIND_ENV) or "a100-80gb"
    if simulate_gpus:
        return capabilities.simulated_capabilities(simulate_gpus, simulate_kind)
    return await capabilities.run_probe()


class Embedded:
    """ControlPlane + stores + (optionally) an in-process local worker, as one context."""

    def __init__(
        self,
        home: str | Path | None = None,
        *,
        local_worker: bool = True,
        simulate_gpus: int | None = None,
        simulate_kind: str | None = None,
        heartbeat_timeout: float = 30.0,
        worker_name: str | None = None,
    ) -> None:
        self.layout = Layout(home_dir(home))
        self.lock = StateLock(self.layout)
        self.store = SqliteStore(self.layout.db)
        self.cp = ControlPlane(
            self.store,
            LocalArtifactStore(self.layout.artifacts),
            heartbeat_timeout=heartbeat_timeout,
        )
        self._want_worker = local_worker
        self._simulate = (simulate_gpus, simulate_kind)
        self._worker_name = worker_name or f"local-{socket.gethostname()}"
        self.worker: WorkerAgent | None = None

    async def start(self) -> Embedded:
        self.lock.acquire()
        try:
            await self.store.open()
            await self.cp.start()
            if self._want_worker:
                caps = await local_capabilities(*self._simulate)
                self.worker = WorkerAgent(
                    InProcessTransport(self.cp),
                    WorkerRegistration(name=self._worker_name, capabilities=caps),
                    ExecutorConfig(work_root=self.layout.work),
                    heartbeat_interval=max(0.5, self.cp.heartbeat_timeout / 3),
                )
                await self.worker.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
        await self.cp.close()
        await self.store.close()
        self.lock.release()

    async def __aenter__(self) -> Embedded:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
