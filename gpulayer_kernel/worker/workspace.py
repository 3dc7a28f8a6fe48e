"""A worker's workspace calls (ADR 0022) through its transport: in-process, or its own HTTP
(its session token, failover and TLS rules). ``workspace_for`` makes a session attempt's
:class:`~gpulayer_kernel.workspace.remote.WorkerWorkspace` with the right one, ``job_workspace``
a one-shot job's :class:`~gpulayer_kernel.workspace.jobs.JobWorkspace`; and ``shares_from``
what a worker declares when it joins (its host id and ``--shared-path``s)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contracts import JobAssignment
from ..contracts.workspace import (
    Digests,
    WorkerShares,
    WorkspaceAnswer,
    WorkspaceCalls,
    WorkspacePlan,
)
from ..errors import NotFound
from ..workspace.jobs import JobWorkspace
from ..workspace.plan import host_id, parse_share
from ..workspace.remote import WorkerLink, WorkerWorkspace
from .config import ExecutorConfig
from .transport import AttemptTransport, InProcessTransport, Transport

if TYPE_CHECKING:  # httpx only where a worker talks HTTP: an embedded `gpulayer run` never does
    import httpx

    from ..wire.http import Wire

SHARED_ENV = "GPULAYER_SHARED_PATHS"  # "HERE=THERE:HERE2=THERE2", as --shared-path


class _InProcess:
    def __init__(self, transport: InProcessTransport) -> None:
        self.cp = transport.cp
        self.transport = transport
        self.plane = transport.cp.workspace

    async def plan(self, job_id: str) -> WorkspacePlan | None:
        return await self.plane.plan(await self.cp.get(job_id), self.transport.worker_id)

    @property
    def worker_id(self) -> str:
        wid = self.transport.worker_id
        assert wid is not None, "a worker holds attempts only once it has joined"
        return wid

    async def calls(self, job_id: str, wait: float) -> WorkspaceCalls:
        return await self.plane.next_calls(job_id, self.worker_id, wait)

    async def answer(self, job_id: str, answer: WorkspaceAnswer) -> None:
        await self.plane.answer(job_id, self.worker_id, answer)

    async def read_pack(self, job_id: str, digests: list[str]) -> bytes:
        return await self.plane.read_pack(digests, await self.plane.owner_of(job_id))

    async def put_pack(self, job_id: str, blob: bytes) -> None:
        await self.plane.put_pack(blob, await self.plane.owner_of(job_id))


class _Http:
    """The worker routes on its transport's wire (``wire/http.py``: failover, TLS, its session
    token, the error mapping)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        from ..client.calls import Req

        return await self.wire.send(Req(method, f"/worker/jobs/{path}", **kw))

    async def plan(self, job_id: str) -> WorkspacePlan | None:
        try:
            resp = await self._send("GET", f"{job_id}/workspace/plan")
        except NotFound:
            return None
        return WorkspacePlan.model_validate_json(resp.content)

    async def calls(self, job_id: str, wait: float) -> WorkspaceCalls:
        resp = await self._send(
            "GET", f"{job_id}/workspace/calls", params=[("wait", str(wait))], timeout=wait + 30
        )
        return WorkspaceCalls.model_validate_json(resp.content)

    async def answer(self, job_id: str, answer: WorkspaceAnswer) -> None:
        await self._send("POST", f"{job_id}/workspace/calls", json=answer.model_dump_json())

    async def read_pack(self, job_id: str, digests: list[str]) -> bytes:
        resp = await self._send(
            "POST",
            f"{job_id}/workspace/objects/read",
            json=Digests(digests=digests).model_dump_json(),
            timeout=600.0,
        )
        return bytes(resp.content)

    async def put_pack(self, job_id: str, blob: bytes) -> None:
        await self._send("POST", f"{job_id}/workspace/objects", content=blob, timeout=600.0)


def link_for(transport: Transport) -> WorkerLink:
    inner = transport.inner if isinstance(transport, AttemptTransport) else transport
    if isinstance(inner, InProcessTransport):
        return _InProcess(inner)
    from .http import HttpTransport

    assert isinstance(inner, HttpTransport), type(inner).__name__
    return _Http(inner.wire)


def workspace_for(job_id: str, transport: Transport, scratch: Path) -> WorkerWorkspace:
    return WorkerWorkspace(job_id, link_for(transport), scratch)


def job_workspace(
    a: JobAssignment, transport: Transport, config: ExecutorConfig
) -> JobWorkspace | None:
    """A one-shot job's workspace (``workspace/jobs.py``), when its workload names a folder:
    decided here, from what this worker declared (``config.shares``), without a request."""
    source = getattr(a.job.spec.workload, "workspace", None)
    if source is None:
        return None
    inner = transport.inner if isinstance(transport, AttemptTransport) else transport
    return JobWorkspace(
        a.job.id,
        a.job.owner,
        a.node.node_rank,
        source,
        worker=a.node.worker_name,
        shares=config.shares,
        in_process=isinstance(inner, InProcessTransport),
        link=lambda: link_for(transport),
        put_blob=transport.put_blob,
        work_root=config.work_root,
    )


def shares_from(
    paths: Iterable[str] = (), *, host: str | None = None, synced: bool = True
) -> WorkerShares:
    """This worker's declaration: its host id, ``paths`` (and ``$GPULAYER_SHARED_PATHS``)."""
    texts = list(paths) + [p for p in os.environ.get(SHARED_ENV, "").split(":") if p.strip()]
    shared = [parse_share(t) for t in texts]
    return WorkerShares(host=host or host_id(), shared=shared, synced=synced)
