"""``NullTransport``: a worker transport that answers everything and does nothing (a fake).

For tests of the worker's parts that need a :class:`~gpulayer_kernel.worker.transport.Transport`
but not a control plane: subclass it and override the calls the test is about (joins, polls,
rendezvous); every other report is accepted and dropped, and a long-poll runs out with no work.
"""

from __future__ import annotations

from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
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
from ..errors import Conflict, NotFound
from ..worker.transport import KernelLink, Transport


class NullTransport(Transport):
    """A control plane that takes every report and never has work (nor blobs, nor rendezvous)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock

    async def register(self, reg: WorkerRegistration) -> WorkerInfo:
        self.worker_id = "w-1"
        now = self.clock.now()
        return WorkerInfo(
            id="w-1",
            name=reg.name,
            capabilities=reg.capabilities,
            registered_at=now,
            last_heartbeat=now,
        )

    async def heartbeat(self) -> None: ...

    async def next_work(self, wait: float) -> Work:
        await self.clock.sleep(wait)  # a long-poll that runs out: no work
        return Work()

    async def report_started(self, job_id: str, attempt: int | None = None) -> None: ...

    async def append_logs(
        self, job_id: str, lines: list[LogLine], attempt: int | None = None
    ) -> None: ...

    async def report_progress(
        self, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None: ...

    async def report_finished(self, job_id: str, report: FinishReport) -> None: ...

    async def report_cell(self, job_id: str, report: CellReport) -> None: ...

    async def report_session(self, job_id: str, report: SessionReport) -> None: ...

    async def fetch_blob(self, digest: str) -> bytes:
        raise NotFound(f"no blob {digest[:12]} (a NullTransport holds none)", code="blob_not_found")

    async def put_blob(self, data: bytes) -> str:
        import hashlib

        return hashlib.sha256(data).hexdigest()

    async def publish_rendezvous(self, job_id: str, rdzv: Rendezvous) -> None: ...

    async def get_rendezvous(self, job_id: str, wait: float) -> Rendezvous:
        await self.clock.sleep(wait)  # a long-poll that runs out
        raise Conflict("no rendezvous yet", code="rendezvous_pending")

    async def deregister(self) -> None: ...

    def kernel_link(self) -> KernelLink:
        raise NotFound("a NullTransport relays no GPU kernel", code="kernel_not_found")
