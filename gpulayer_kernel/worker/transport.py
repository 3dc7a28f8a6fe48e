"""How a worker talks to its control plane: one interface, two implementations (ADR 0003).

``InProcessTransport`` calls a ControlPlane on the same event loop (the embedded default);
``gpulayer_kernel.worker.http.HttpTransport`` speaks the HTTP long-poll protocol. The worker agent
and executor never know which one they hold.
"""

from __future__ import annotations

import abc
from typing import Any

from ..contracts import (
    FinishReport,
    LogLine,
    Rendezvous,
    Work,
    WorkerInfo,
    WorkerRegistration,
)
from ..controlplane import ControlPlane


class Transport(abc.ABC):
    """The worker's side of the worker protocol."""

    worker_id: str | None = None

    @abc.abstractmethod
    async def register(self, reg: WorkerRegistration) -> WorkerInfo: ...

    @abc.abstractmethod
    async def heartbeat(self) -> None: ...

    @abc.abstractmethod
    async def next_work(self, wait: float) -> Work: ...

    @abc.abstractmethod
    async def report_started(self, job_id: str) -> None: ...

    @abc.abstractmethod
    async def append_logs(self, job_id: str, lines: list[LogLine]) -> None: ...

    @abc.abstractmethod
    async def report_progress(self, job_id: str, fields: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    async def report_finished(self, job_id: str, report: FinishReport) -> None: ...

    @abc.abstractmethod
    async def fetch_blob(self, digest: str) -> bytes: ...

    @abc.abstractmethod
    async def put_blob(self, data: bytes) -> str: ...

    @abc.abstractmethod
    async def publish_rendezvous(self, job_id: str, rdzv: Rendezvous) -> None: ...

    @abc.abstractmethod
    async def get_rendezvous(self, job_id: str, wait: float) -> Rendezvous: ...

    @abc.abstractmethod
    async def deregister(self) -> None: ...

    async def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release connections (nothing to release in-process)."""

    def _id(self) -> str:
        if self.worker_id is None:
            raise RuntimeError("register() first")
        return self.worker_id


class InProcessTransport(Transport):
    """Direct calls into a ControlPlane on the same loop: the embedded default."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def register(self, reg: WorkerRegistration) -> WorkerInfo:
        info = await self.cp.register(
            reg.model_copy(update={"transport": "inprocess"}), self.worker_id
        )
        self.worker_id = info.id
        return info

    async def heartbeat(self) -> None:
        await self.cp.heartbeat(self._id())

    async def next_work(self, wait: float) -> Work:
        return await self.cp.next_work(self._id(), wait)

    async def report_started(self, job_id: str) -> None:
        await self.cp.report_started(self._id(), job_id)

    async def append_logs(self, job_id: str, lines: list[LogLine]) -> None:
        await self.cp.append_logs(self._id(), job_id, lines)

    async def report_progress(self, job_id: str, fields: dict[str, Any]) -> None:
        await self.cp.report_progress(self._id(), job_id, fields)

    async def report_finished(self, job_id: str, report: FinishReport) -> None:
        await self.cp.report_finished(self._id(), job_id, report)

    async def fetch_blob(self, digest: str) -> bytes:
        return await self.cp.get_blob(digest)

    async def put_blob(self, data: bytes) -> str:
        return await self.cp.put_blob(data)

    async def publish_rendezvous(self, job_id: str, rdzv: Rendezvous) -> None:
        await self.cp.publish_rendezvous(self._id(), job_id, rdzv)

    async def get_rendezvous(self, job_id: str, wait: float) -> Rendezvous:
        return await self.cp.get_rendezvous(self._id(), job_id, wait)

    async def deregister(self) -> None:
        if self.worker_id is not None:
            await self.cp.deregister(self.worker_id)
