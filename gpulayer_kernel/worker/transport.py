"""How a worker talks to its control plane: one interface, two implementations (ADR 0003).

``InProcessTransport`` calls a ControlPlane on the same event loop (the embedded default);
``gpulayer_kernel.worker.http.HttpTransport`` speaks the HTTP long-poll protocol. The worker agent
and executor never know which one they hold.

Every report about a job names the attempt it comes from (``attempt``; None: "the current one",
as older workers sent). The agent hands each executor an :class:`AttemptTransport`: the worker's
transport seen from one attempt, which names that attempt in every report and tells the agent
when the control plane refuses one because the attempt is stale (or no longer this worker's),
so its process is stopped and dropped rather than treated as a crash.

Protocol 1.1 (ADR 0003): ``report`` takes everything known about several attempts at once
(``JobReport``: started, lines, progress, end) and answers each entry on its own. The worker's
:class:`~gpulayer_kernel.worker.reports.Reporter` sends through it; a transport to a control
plane that predates it falls back to the one-call-per-kind methods, entry by entry.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..contracts import (
    CellReport,
    FinishReport,
    JobReport,
    LogLine,
    Rendezvous,
    SessionReport,
    Work,
    WorkerInfo,
    WorkerRegistration,
)
from ..contracts.kernels import KernelConnection, KernelExit
from ..errors import GPUlayerError
from ..wire.kernels import KernelMessage, LanePage

if TYPE_CHECKING:
    # A worker joined over HTTP never loads the control plane (~200 ms at its start).
    from ..controlplane import ControlPlane
    from .reports import Reporter

T = TypeVar("T")
# Refusals that mean "the control plane has moved on from this attempt": stop it, drop it.
MOVED_ON = frozenset({"stale_attempt", "not_assigned", "not_your_job"})


class KernelLink(Protocol):
    """A worker's calls on the control plane's kernel relay (ADR 0021), per transport: the key to
    start a kernel with, its messages both ways, its process's exit."""

    async def connection(self, job_id: str, wait: float) -> KernelConnection | None: ...
    async def receive(self, job_id: str, since: int, wait: float) -> LanePage: ...
    async def send(self, job_id: str, messages: list[KernelMessage]) -> None: ...
    async def exited(self, job_id: str, report: KernelExit) -> None: ...
    async def close(self) -> None: ...


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

    async def report(self, reports: Sequence[JobReport]) -> list[GPUlayerError | None]:
        """Several attempts' reports at once; each entry's refusal (None: taken), in order.

        This default speaks protocol 1.0: per entry, its start, lines, progress and end each
        in their own call (a refused part refuses the rest of its entry)."""
        outcomes: list[GPUlayerError | None] = []
        for r in reports:
            try:
                if r.started:
                    await self.report_started(r.job_id, r.attempt)
                if r.lines:
                    await self.append_logs(r.job_id, list(r.lines), r.attempt)
                if r.progress is not None:
                    await self.report_progress(r.job_id, dict(r.progress), r.attempt)
                if r.finished is not None:
                    await self.report_finished(
                        r.job_id, r.finished.model_copy(update={"attempt": r.attempt})
                    )
            except GPUlayerError as exc:
                if exc.status >= 500 or exc.status == 401:
                    raise  # the control plane is away, or this worker must re-join: retried
                outcomes.append(exc)
                continue
            outcomes.append(None)
        return outcomes

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

    @abc.abstractmethod
    def kernel_link(self) -> KernelLink:
        """A link to the kernel relay for one GPU kernel's executor."""

    async def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release connections (nothing to release in-process)."""

    def _id(self) -> str:
        if self.worker_id is None:
            raise RuntimeError("register() first")
        return self.worker_id


class InProcessKernelLink:
    """The relay's calls on a control plane on this loop (the embedded default)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.relay = cp.kernels

    async def connection(self, job_id: str, wait: float) -> KernelConnection | None:
        return await self.relay.connection(job_id, wait)

    async def receive(self, job_id: str, since: int, wait: float) -> LanePage:
        return await self.relay.worker_receive(job_id, since, wait)

    async def send(self, job_id: str, messages: list[KernelMessage]) -> None:
        await self.relay.worker_send(job_id, messages)

    async def exited(self, job_id: str, report: KernelExit) -> None:
        await self.relay.worker_exited(job_id, report)

    async def close(self) -> None:
        pass


class InProcessTransport(Transport):
    """Direct calls into a ControlPlane on the same loop: the embedded default."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def kernel_link(self) -> KernelLink:
        return InProcessKernelLink(self.cp)

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

    async def report(self, reports: Sequence[JobReport]) -> list[GPUlayerError | None]:
        return await self.cp.report(self._id(), reports)

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
    on as before, so each caller drops what it was sending. With a ``reporter`` (the worker's)
    its start, lines and progress go through it, merged with the rest of the worker's reports.
    """

    def __init__(
        self,
        inner: Transport,
        attempt: int,
        moved_on: Callable[[], None],
        reporter: Reporter | None = None,
    ) -> None:
        self.inner = inner
        self.attempt = attempt
        self.moved_on = moved_on
        self.reporter = reporter
        self.worker_id = inner.worker_id

    def kernel_link(self) -> KernelLink:
        return self.inner.kernel_link()

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
        if self.reporter is not None:
            await self._call(self.reporter.started(job_id, self.attempt))
        else:
            await self._call(self.inner.report_started(job_id, self.attempt))

    async def append_logs(
        self, job_id: str, lines: list[LogLine], attempt: int | None = None
    ) -> None:
        if self.reporter is not None:
            await self._call(self.reporter.logs(job_id, self.attempt, lines))
        else:
            await self._call(self.inner.append_logs(job_id, lines, self.attempt))

    def queue_logs(self, job_id: str, lines: list[LogLine]) -> asyncio.Future[None]:
        """Queue lines with the worker's reporter without waiting for them to be taken: they go
        in order, before (or with) the attempt's end. Needs a ``reporter``. The future says
        when they were taken (the shipper's backlog counts them until then)."""
        assert self.reporter is not None
        taken = self.reporter.logs(job_id, self.attempt, lines)
        taken.add_done_callback(self._refused)
        return taken

    def _refused(self, fut: asyncio.Future[None]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if isinstance(exc, GPUlayerError) and exc.code in MOVED_ON:
            self.moved_on()

    async def report_progress(
        self, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None:
        if self.reporter is not None:
            await self._call(self.reporter.progress(job_id, self.attempt, fields))
        else:
            await self._call(self.inner.report_progress(job_id, fields, self.attempt))

    async def report_finished(self, job_id: str, report: FinishReport) -> None:
        named = report.model_copy(update={"attempt": self.attempt})
        if self.reporter is not None:
            await self._call(self.reporter.finished(job_id, self.attempt, named))
        else:
            await self._call(self.inner.report_finished(job_id, named))

    async def report(self, reports: Sequence[JobReport]) -> list[GPUlayerError | None]:
        return await self.inner.report(reports)

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
