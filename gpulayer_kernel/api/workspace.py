"""The workspace routes of ``/api/v1`` (ADR 0022): the Jupyter host's under ``/sessions/{session}
/workspace`` and ``/workspace``, the worker's under ``/worker/jobs/{job_id}/workspace``. Thin:
parse, call the control plane's workspace part (``workspace/service.py``), answer.

Objects travel in packs (``workspace/pack.py``, zstd): a raw body in, raw bytes out. Every object
is claimed for one user: the uploader, or the owner of the session whose worker sent it back.
"""

from __future__ import annotations

from ..contracts.workspace import (
    Digests,
    WorkspaceAnswer,
    WorkspaceCall,
    WorkspaceCalls,
    WorkspacePlan,
    WorkspaceView,
)
from ..errors import NotFound
from ..security import Role
from ..security.roles import resolved
from .mixin import GLMixin
from .ops import op
from .params import WAIT
from .worker_routes import WORKER, WorkerRoute


def _none(ref: str) -> NotFound:
    return NotFound(
        f"session {ref} has no workspace (it named no notebook folder, or is not placed yet)",
        hint="a kernel started from a notebook names its folder; GET /sessions/{id} says where "
        "it waits",
        code="workspace_none",
    )


class SessionWorkspaceHandler(GLMixin):
    route = "/sessions/{session}/workspace"

    @op(
        "where the session's code runs: in place, synced, or none and why",
        answer=WorkspaceView,
        errors=(403, 404),
        role=Role.VIEWER,
    )
    async def get(self, session: str) -> WorkspaceView:
        view = await self.cp.workspace.view(session, self.who)
        if view is None:
            raise _none(session)
        return view


class SessionWorkspaceCallsHandler(GLMixin):
    route = "/sessions/{session}/workspace/calls"

    @op(
        "a call on the session's worker (sync a delta, collect outputs); waits up to `wait` "
        "for its answer (503 workspace_timeout: send the same call again)",
        body=WorkspaceCall,
        answer=WorkspaceAnswer,
        query=(WAIT,),
        errors=(403, 404, 422, 503),
        role=Role.USER,
    )
    async def post(self, session: str, body: WorkspaceCall, wait: float) -> WorkspaceAnswer:
        call = self.cp.workspace.call(session, body, wait, self.who)
        return await self.long_poll(wait, call)


class WorkspaceMissingHandler(GLMixin):
    route = "/workspace/missing"

    @op(
        "which of these file digests the store lacks for you (another user's copy counts as "
        "missing: upload its bytes)",
        body=Digests,
        answer=Digests,
        errors=(422,),
        role=Role.USER,
    )
    async def post(self, body: Digests) -> Digests:
        return Digests(digests=await self.cp.workspace.missing(list(body.digests), self.who))


class WorkspaceObjectsHandler(GLMixin):
    route = "/workspace/objects"

    @op(
        "upload a pack of files (zstd; each verified by its sha256), claimed for you",
        body="raw",
        answer=None,
        status=204,
        errors=(413, 422),
        role=Role.USER,
    )
    async def post(self, data: bytes) -> None:
        await self.cp.workspace.put_pack(data, resolved(self.who).user)


class WorkspaceReadHandler(GLMixin):
    route = "/workspace/objects/read"

    @op(
        "a pack of those of these files that are yours (others are left out)",
        body=Digests,
        answer="bytes",
        errors=(422,),
        role=Role.USER,
    )
    async def post(self, body: Digests) -> bytes:
        return await self.cp.workspace.read_pack(list(body.digests), resolved(self.who).user)


# -- worker routes -------------------------------------------------------------------------------


class WorkerWorkspacePlanHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/workspace/plan"

    @op(
        "how this session's workspace is made here: in place (where), synced, or none",
        answer=WorkspacePlan,
        errors=(404,),
        kinds=WORKER,
    )
    async def get(self, job_id: str) -> WorkspacePlan:
        plan = await self.cp.workspace.plan(await self.cp.get(job_id), self.worker_id)
        if plan is None:
            raise _none(job_id)
        return plan


class WorkerWorkspaceCallsHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/workspace/calls"

    @op(
        "the Jupyter host's calls this worker has not answered (long-poll with `wait`)",
        answer=WorkspaceCalls,
        query=(WAIT,),
        kinds=WORKER,
    )
    async def get(self, job_id: str, wait: float) -> WorkspaceCalls:
        return await self.long_poll(
            wait, self.cp.workspace.next_calls(job_id, self.worker_id, wait)
        )

    @op("the answer to one call", body=WorkspaceAnswer, answer=None, status=204, kinds=WORKER)
    async def post(self, job_id: str, body: WorkspaceAnswer) -> None:
        await self.cp.workspace.answer(job_id, self.worker_id, body)


class WorkerWorkspaceObjectsHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/workspace/objects"

    @op(
        "upload a pack of the session's output files, claimed for the session's owner",
        body="raw",
        answer=None,
        status=204,
        errors=(413, 422),
        kinds=WORKER,
    )
    async def post(self, job_id: str, data: bytes) -> None:
        plane = self.cp.workspace
        await plane.put_pack(data, await plane.owner_of(job_id))


class WorkerWorkspaceReadHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/workspace/objects/read"

    @op(
        "a pack of the session owner's files among these digests",
        body=Digests,
        answer="bytes",
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: Digests) -> bytes:
        plane = self.cp.workspace
        return await plane.read_pack(list(body.digests), await plane.owner_of(job_id))


USER_ROUTES = (
    SessionWorkspaceHandler,
    SessionWorkspaceCallsHandler,
    WorkspaceMissingHandler,
    WorkspaceObjectsHandler,
    WorkspaceReadHandler,
)
WORKER_ROUTES = (
    WorkerWorkspacePlanHandler,
    WorkerWorkspaceCallsHandler,
    WorkerWorkspaceObjectsHandler,
    WorkerWorkspaceReadHandler,
)
