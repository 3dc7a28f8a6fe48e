"""How a worker talks to its control plane: one interface, two implementations (ADR 0003).

``InProcessTransport`` calls a ControlPlane on the same event loop (the embedded default);
``gpulayer_kernel.worker.http.HttpTransport`` speaks the HTTP long-poll protocol. The worker agent
and executor never know which one they hold.

Every report about a job names the attempt it comes from (``attempt``; None: "the current one",
as older workers sent). The agent hands each executor an :class:`AttemptTransport`: the worker's
transport seen from one attempt, which names that attempt in every report and tells the agent
when the control plane refuses one because the attempt is stale (or no longer this worker's),
so its process is stopped and dropped rather than treated as a crash.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..contracts import (
    CellReport,
    FinishReport,
    LogLine,
    Rendezvous,
    SessionReport,
    Work,
    WorkerInfo,
    WorkerRegistration,
)
from ..controlplane import ControlPlane
from ..errors import GPUlayerError

T = TypeVar("T")
# Refusals that mean "the control plane has moved on from this attempt": stop it, drop it.
MOVED_ON = frozenset({"stale_attempt", "not_assigned", "not_your_job"})


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
    async def report_started(self, job_id: str, attempt: int | None = None) -> None: ...

    @abc.abstractmethod
    async def append_logs(
        self, job_id: str, lines: list[LogLine], attempt: int | None = None
    ) -> None: ...

    @abc.abstractmethod
    async def report_progress(
        self, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None: ...

    @abc.abstractmethod
    async def report_finished(self, job_id: str, report: FinishReport) -> None: ...

    @abc.abstractmethod
    async def report_cell(self, job_id: str, report: CellReport) -> None:
        """A session cell's end on this worker's ranks (ADR 0019)."""

    @abc.abstractmethod
    async def report_session(self, job_id: str, report: SessionReport) -> None:
        """A session's processes changed outside a cell: up again, or broken."""

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

    async def report_started(self, job_id: str, attempt: int | None = None) -> None:
        await self.cp.report_started(self._id(), job_id, attempt)

    async def append_logs(
        self, job_id: str, lines: list[LogLine], attempt: int | None = None
    ) -> None:
        await self.cp.append_logs(self._id(), job_id, lines, attempt)

    async def report_progress(
        self, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None:
        await self.cp.report_progress(self._id(), job_id, fields, attempt)

    async def report_finished(self, job_id: str, report: FinishReport) -> None:
        await self.cp.report_finished(self._id(), job_id, report)

    async def report_cell(self, job_id: str, report: CellReport) -> None:
        await self.cp.report_cell(self._id(), job_id, report)

    async def report_session(self, job_id: str, report: SessionReport) -> None:
        await self.cp.report_session(self._id(), job_id, report)

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


class AttemptTransport(Transport):
    """One attempt's view of the worker's transport: every report names ``attempt``.

    ``moved_on()`` is called when the control plane refuses a report because it has moved on
    from this attempt (``MOVED_ON``: stale, or no longer this worker's); the refusal is raised
    on as before, so each caller drops what it was sending.
    """

    def __init__(self, inner: Transport, attempt: int, moved_on: Callable[[], None]) -> None:
        self.inner = inner
        self.attempt = attempt
        self.moved_on = moved_on
        self.worker_id = inner.worker_id

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except GPUlayerError as exc:
            if exc.code in MOVED_ON:
                self.moved_on()
            raise

    async def register(self, reg: WorkerRegistration) -> WorkerInfo:
        return await self.inner.register(reg)

    async def heartbeat(self) -> None:
        await self.inner.heartbeat()

    async def next_work(self, wait: float) -> Work:
        return await self.inner.next_work(wait)

    async def report_started(self, job_id: str, attempt: int | None = None) -> None:
        await self._call(self.inner.report_started(job_id, self.attempt))

    async def append_logs(
        self, job_id: str, lines: list[LogLine], attempt: int | None = None
    ) -> None:
        await self._call(self.inner.append_logs(job_id, lines, self.attempt))

    async def report_progress(
        self, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None:
        await self._call(self.inner.report_progress(job_id, fields, self.attempt))

    async def report_finished(self, job_id: str, report: FinishReport) -> None:
        named = report.model_copy(update={"attempt": self.attempt})
        await self._call(self.inner.report_finished(job_id, named))

    async def report_cell(self, job_id: str, report: CellReport) -> None:
        named = report.model_copy(update={"attempt": self.attempt})
        await self._call(self.inner.report_cell(job_id, named))

    async def report_session(self, job_id: str, report: SessionReport) -> None:
        named = report.model_copy(update={"attempt": self.attempt})
        await self._call(self.inner.report_session(job_id, named))

    async def fetch_blob(self, digest: str) -> bytes:
        return await self._call(self.inner.fetch_blob(digest))

    async def put_blob(self, data: bytes) -> str:
        return await self.inner.put_blob(data)

    async def publish_rendezvous(self, job_id: str, rdzv: Rendezvous) -> None:
        named = rdzv.model_copy(update={"attempt": self.attempt})
        await self._call(self.inner.publish_rendezvous(job_id, named))

    async def get_rendezvous(self, job_id: str, wait: float) -> Rendezvous:
        return await self._call(self.inner.get_rendezvous(job_id, wait))

    async def deregister(self) -> None:
        await self.inner.deregister()
