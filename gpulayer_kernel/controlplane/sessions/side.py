"""The ControlPlane's sessions (ADR 0019), as clients call them: each call checks the caller and
hands the work to the sessions part (``table.py``); stops and attaches go in the audit log. A
service given only the parts it works with; ``ControlPlane`` offers its calls as its own.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from ...contracts import (
    CellPage,
    CellRequest,
    CellRun,
    SessionHold,
    SessionHolder,
    SessionInfo,
    SessionSpec,
)
from ...errors import NotFound
from ...security.roles import Identity, can_read

if TYPE_CHECKING:
    from ..audit import AuditLog
    from ..blobs import Blobs
    from ..idempotency import Claim
    from ..jobs import JobTable
    from .table import SessionTable


class SessionCalls:
    """The session calls of the client side."""

    def __init__(
        self, sessions: SessionTable, blobs: Blobs, audit: AuditLog, jobs: JobTable
    ) -> None:
        self.sessions = sessions
        self.blobs = blobs
        self.audit = audit
        self.jobs = jobs

    def session_holds(self) -> builtins.list[SessionHold]:
        """Wiring: the sessions holding GPUs, for waiting jobs' sentences. Read from the live
        sessions, not the job table: a scheduling pass asks once, and 5,000 workers' running
        jobs made a walk of every active job per waiting job the whole of a pass (issue 35)."""
        holds = []
        for job_id in self.sessions.live_ids():
            job = self.jobs.cached(job_id)
            held = self.sessions.hold(job_id)
            if job is None or job.placement is None or held is None:
                continue
            for node in job.placement.nodes:
                if node.devices:
                    holds.append(
                        SessionHold(
                            session_id=job.id,
                            name=job.spec.name,
                            holder=held[0],
                            worker=node.worker_name,
                            gpus=len(node.devices),
                            idle_since=held[1],
                        )
                    )
        return holds

    # A session is its job's owner's: users read and act on their own, viewers read all, admins
    # act on all (``who=None``: the embedded admin). Only its holder runs cells in it.

    async def start_session(
        self, spec: SessionSpec, *, who: Identity | None = None, claim: Claim | None = None
    ) -> SessionInfo:
        """Queue a session: a job that holds its GPUs and runs cells until stopped or idle."""
        return await self.sessions.start(spec, who, claim)

    async def list_sessions(
        self, *, include_ended: bool = False, who: Identity | None = None
    ) -> builtins.list[SessionInfo]:
        found = self.sessions.all() if include_ended else self.sessions.live()
        return [s for s in found if can_read(who, s.job.owner)]

    async def get_session(self, ref: str, *, who: Identity | None = None) -> SessionInfo:
        """A session by name or by its job's id (or a unique prefix of it)."""
        s, job = await self.sessions.find(ref, who)
        return self.sessions.info(s, job)

    async def run_cell(
        self,
        ref: str,
        request: CellRequest,
        wait: float = 0.0,
        *,
        who: Identity | None = None,
        claim: Claim | None = None,
    ) -> CellPage:
        """Run a cell in a session; within ``wait`` s the answer carries its output and end."""
        digest = request.inputs_blob
        if digest is not None and not await self.blobs.has(digest, who=who):
            raise NotFound(
                f"blob {digest[:12]}… (the cell's inputs) has not been uploaded",
                hint="upload it with put_blob first (the magics do this for you)",
                code="blob_not_found",
            )
        return await self.sessions.run(ref, request, wait, who, claim)

    async def follow_cell(
        self,
        ref: str,
        number: int,
        since: int = 0,
        wait: float = 0.0,
        *,
        who: Identity | None = None,
    ) -> CellPage:
        """A cell and its output records after ``since``, long-polled with ``wait``."""
        return await self.sessions.follow(ref, number, since, wait, who)

    async def session_cells(
        self, ref: str, limit: int = 100, *, who: Identity | None = None
    ) -> builtins.list[CellRun]:
        return await self.sessions.cells(ref, limit, who)

    async def interrupt_session(self, ref: str, *, who: Identity | None = None) -> SessionInfo:
        return await self.sessions.interrupt(ref, who)

    async def restart_session(self, ref: str, *, who: Identity | None = None) -> SessionInfo:
        return await self.sessions.restart(ref, who)

    async def stop_session(
        self, ref: str, reason: str = "stopped by the user", *, who: Identity | None = None
    ) -> SessionInfo:
        """End a session and free its GPUs; ``reason`` is what its job and cells say."""
        info = await self.sessions.stop(ref, reason, who)
        await self.audit.record(who, "session.stop", info.id, name=info.name)
        return info

    async def attach_session(
        self, ref: str, holder: SessionHolder, *, who: Identity | None = None
    ) -> SessionInfo:
        info = await self.sessions.attach(ref, holder, who)
        await self.audit.record(who, "session.attach", info.id, name=info.name)
        return info
