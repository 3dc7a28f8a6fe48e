"""The session routes of ``/api/v1`` (ADR 0019): user routes under ``/sessions``, and the two
worker routes a session's workers report through. Thin, as every handler: parse the contract,
call the ControlPlane, answer a contract. ``{session}`` is a session's name or its job's id.
"""

from __future__ import annotations

from ..contracts import (
    AttachRequest,
    CellList,
    CellPage,
    CellReport,
    CellRequest,
    SessionInfo,
    SessionList,
    SessionReport,
    SessionSpec,
)
from ..security import Role
from .mixin import GLMixin
from .ops import op
from .params import WAIT, Param, path_integer
from .worker_routes import WORKER, WorkerRoute

SESSION = "`{session}`: a session's name or its job's id (or a unique prefix of 4+ characters)"


class SessionsHandler(GLMixin):
    route = "/sessions"

    @op(
        "start a session: a job that holds its GPUs and keeps state across cells; it waits in "
        "the queue like any job (its name must be free among live sessions: else 409)",
        body=SessionSpec,
        answer=SessionInfo,
        status=201,
        errors=(409, 422),
        role=Role.USER,
        idempotent="once",
    )
    async def post(self, body: SessionSpec) -> SessionInfo:
        return await self.cp.start_session(body, who=self.who, claim=self.gl_claim)

    @op(
        "live sessions (`all=1`: also those that ended lately)",
        answer=SessionList,
        query=(Param("all", "integer", 0, 0, 1, "1: also sessions that ended"),),
        role=Role.VIEWER,
    )
    async def get(self, all: float) -> SessionList:
        sessions = await self.cp.list_sessions(include_ended=bool(all), who=self.who)
        return SessionList(sessions=sessions)


class SessionHandler(GLMixin):
    route = "/sessions/{session}"

    @op(f"one session; {SESSION}", answer=SessionInfo, errors=(404,), role=Role.VIEWER)
    async def get(self, session: str) -> SessionInfo:
        return await self.cp.get_session(session, who=self.who)


class SessionCellsHandler(GLMixin):
    route = "/sessions/{session}/cells"

    @op(
        "run a cell in the session, on every rank; the answer comes within `wait` seconds with "
        "its output and, if it ended by then, its outcome (follow on with GET .../cells/{number})",
        body=CellRequest,
        answer=CellPage,
        query=(WAIT,),
        errors=(403, 404, 409, 422),
        role=Role.USER,
        idempotent="follow",
    )
    async def post(self, session: str, body: CellRequest, wait: float) -> CellPage:
        return await self.long_poll(
            wait, self.cp.run_cell(session, body, wait, who=self.who, claim=self.gl_claim)
        )

    @op(
        "the session's cells, newest first (running and queued ones too)",
        answer=CellList,
        query=(Param("limit", "integer", 100, 1, 10_000),),
        role=Role.VIEWER,
    )
    async def get(self, session: str, limit: float) -> CellList:
        return CellList(cells=await self.cp.session_cells(session, int(limit), who=self.who))


class SessionCellHandler(GLMixin):
    route = "/sessions/{session}/cells/{number}"

    @op(
        "one cell and its output records after `since` (long-poll with `wait` for more output "
        "or its end)",
        answer=CellPage,
        query=(Param("since", "integer", 0, 0), WAIT),
        errors=(404,),
        role=Role.VIEWER,
    )
    async def get(self, session: str, number: str, since: float, wait: float) -> CellPage:
        n = path_integer("number", number, minimum=1)
        follow = self.cp.follow_cell(session, n, int(since), wait, who=self.who)
        return await self.long_poll(wait, follow)


class SessionInterruptHandler(GLMixin):
    route = "/sessions/{session}/interrupt"

    @op(
        "KeyboardInterrupt in the running cell, on every rank; the session keeps its state",
        answer=SessionInfo,
        errors=(404, 409),
        role=Role.USER,
    )
    async def post(self, session: str) -> SessionInfo:
        return await self.cp.interrupt_session(session, who=self.who)


class SessionRestartHandler(GLMixin):
    route = "/sessions/{session}/restart"

    @op(
        "kill the session's processes and start them again on the same GPUs (state is lost)",
        answer=SessionInfo,
        errors=(404, 409),
        role=Role.USER,
    )
    async def post(self, session: str) -> SessionInfo:
        return await self.cp.restart_session(session, who=self.who)


class SessionStopHandler(GLMixin):
    route = "/sessions/{session}/stop"

    @op(
        "end the session and free its GPUs (its job is cancelled)",
        answer=SessionInfo,
        query=(
            Param(
                "reason",
                "string",
                "stopped by the user",
                description="what the session's job and cells will say",
                max_length=200,
            ),
        ),
        role=Role.USER,
    )
    async def post(self, session: str, reason: str) -> SessionInfo:
        return await self.cp.stop_session(session, reason, who=self.who)


class SessionAttachHandler(GLMixin):
    route = "/sessions/{session}/attach"

    @op(
        "become the session's holder: its cells are yours from now on (a restarted kernel)",
        body=AttachRequest,
        answer=SessionInfo,
        errors=(404, 409),
        role=Role.USER,
    )
    async def post(self, session: str, body: AttachRequest) -> SessionInfo:
        return await self.cp.attach_session(session, body.holder, who=self.who)


# -- worker routes -------------------------------------------------------------------------------


class CellReportHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/cell"

    @op(
        "a session cell's end on this worker's ranks, with its last output lines (idempotent)",
        body=CellReport,
        answer=None,
        status=204,
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: CellReport) -> None:
        await self.cp.report_cell(self.worker_id, job_id, body)


class SessionReportHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/session"

    @op(
        "a session's processes outside a cell: up again after a restart, or broken",
        body=SessionReport,
        answer=None,
        status=204,
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: SessionReport) -> None:
        await self.cp.report_session(self.worker_id, job_id, body)


USER_ROUTES = (
    SessionsHandler,
    SessionHandler,
    SessionCellsHandler,
    SessionCellHandler,
    SessionInterruptHandler,
    SessionRestartHandler,
    SessionStopHandler,
    SessionAttachHandler,
)
WORKER_ROUTES = (CellReportHandler, SessionReportHandler)
