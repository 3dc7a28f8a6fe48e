"""The GPU kernel routes of ``/api/v1`` (ADR 0021): the Jupyter host's under ``/kernels``, the
worker's under ``/worker/jobs/{job_id}/kernel``. Thin: parse the contract, call the control plane's
kernel relay, answer a contract. ``{kernel}`` is the kernel's session id. A kernel is stopped,
listed and explained as the session it is (``/sessions``).

The messages themselves travel on a stream (``streams.py``: one WebSocket per side); the
``frames`` routes here carry them over plain HTTP where a proxy refuses WebSockets, base64 in JSON,
one message of up to ``MAX_MESSAGE`` bytes per request at least (``MAX_FRAMES_BODY``).
"""

from __future__ import annotations

from ..contracts import SessionInfo
from ..contracts.kernels import (
    MAX_FRAMES_BODY,
    KernelConnection,
    KernelExit,
    KernelFrames,
    KernelPage,
    KernelStart,
)
from ..errors import NotFound, ValidationFailed
from ..security import Role
from ..wire.kernels import KernelMessage, LanePage, from_frames, to_frames
from .mixin import GLMixin
from .ops import op
from .params import WAIT, Param
from .worker_routes import WORKER, WorkerRoute

SINCE = Param("since", "integer", 0, 0, description="the cursor of the last page read")


class KernelsHandler(GLMixin):
    route = "/kernels"

    @op(
        "start a GPU kernel: a session whose rank 0 is an ipykernel, relayed through this "
        "server; it waits in the queue like any session (GET /sessions/{id} says why)",
        body=KernelStart,
        answer=SessionInfo,
        status=201,
        errors=(409, 422),
        role=Role.USER,
    )
    async def post(self, body: KernelStart) -> SessionInfo:
        return await self.cp.kernels.start(body, who=self.who)


class KernelAttachHandler(GLMixin):
    route = "/kernels/{kernel}/attach"

    @op(
        "give a restarted control plane a live kernel's key again (it is never stored)",
        body=KernelConnection,
        answer=SessionInfo,
        errors=(403, 404, 422),
        role=Role.USER,
    )
    async def post(self, kernel: str, body: KernelConnection) -> SessionInfo:
        return await self.cp.kernels.attach(kernel, body, who=self.who)


class KernelFramesHandler(GLMixin):
    route = "/kernels/{kernel}/frames"

    @op(
        "messages for the kernel (shell, control, stdin), relayed unchanged",
        body=KernelFrames,
        answer=None,
        status=204,
        errors=(403, 404, 413, 422, 429),
        role=Role.USER,
        body_limit=MAX_FRAMES_BODY,
    )
    async def post(self, kernel: str, body: KernelFrames) -> None:
        await self.cp.kernels.send(kernel, _messages(body), who=self.who)

    @op(
        "the kernel's messages after `since` (long-poll with `wait`), and its state",
        answer=KernelPage,
        query=(SINCE, WAIT),
        errors=(403, 404),
        role=Role.USER,
    )
    async def get(self, kernel: str, since: float, wait: float) -> KernelPage:
        call = self.cp.kernels.receive(kernel, int(since), wait, who=self.who)
        return _page(await self.long_poll(wait, call))


class KernelInterruptHandler(GLMixin):
    route = "/kernels/{kernel}/interrupt"

    @op(
        "interrupt the kernel (SIGINT on its worker: KeyboardInterrupt in the running cell)",
        answer=None,
        status=204,
        errors=(403, 404),
        role=Role.USER,
    )
    async def post(self, kernel: str) -> None:
        await self.cp.kernels.interrupt(kernel, who=self.who)


class KernelRestartHandler(GLMixin):
    route = "/kernels/{kernel}/restart"

    @op(
        "start a new kernel process on the same GPUs (its state is lost), with this key",
        body=KernelConnection,
        answer=KernelPage,
        errors=(403, 404, 409),
        role=Role.USER,
    )
    async def post(self, kernel: str, body: KernelConnection) -> KernelPage:
        return _page(await self.cp.kernels.restart(kernel, body, who=self.who))


# -- worker routes -------------------------------------------------------------------------------


class WorkerKernelConnectionHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/kernel/connection"

    @op(
        "the key to start this session's kernel with (404 until its Jupyter host attached)",
        answer=KernelConnection,
        query=(WAIT,),
        errors=(404,),
        kinds=WORKER,
    )
    async def get(self, job_id: str, wait: float) -> KernelConnection:
        conn = await self.long_poll(wait, self.cp.kernels.connection(job_id, wait))
        if conn is None:
            raise NotFound(
                f"kernel {job_id} has no Jupyter host attached yet",
                hint="the worker asks again",
                code="kernel_not_attached",
            )
        return conn


class WorkerKernelFramesHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/kernel/frames"

    @op(
        "messages for this worker's kernel after `since` (long-poll with `wait`)",
        answer=KernelPage,
        query=(SINCE, WAIT),
        kinds=WORKER,
    )
    async def get(self, job_id: str, since: float, wait: float) -> KernelPage:
        call = self.cp.kernels.worker_receive(job_id, int(since), wait, self.worker_id)
        return _page(await self.long_poll(wait, call))

    @op(
        "the kernel's messages (iopub, and replies on shell, control and stdin)",
        body=KernelFrames,
        answer=None,
        status=204,
        errors=(404, 413, 422, 429),
        kinds=WORKER,
        body_limit=MAX_FRAMES_BODY,
    )
    async def post(self, job_id: str, body: KernelFrames) -> None:
        await self.cp.kernels.worker_send(job_id, _messages(body), self.worker_id)


class WorkerKernelExitHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/kernel/exit"

    @op(
        "the kernel process ended (a restart starts another)",
        body=KernelExit,
        answer=None,
        status=204,
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: KernelExit) -> None:
        await self.cp.kernels.worker_exited(job_id, body)


def _messages(body: KernelFrames) -> list[KernelMessage]:
    try:
        return from_frames(body.frames)
    except ValueError as exc:
        raise ValidationFailed(
            str(exc),
            hint="each part of a frame is one ZMQ frame, base64-encoded",
            details={"field": "frames"},
            code="bad_frame",
        ) from None


def _page(page: LanePage) -> KernelPage:
    return KernelPage(
        frames=to_frames(page.messages),
        next_since=page.next_since,
        state=page.status.state,
        generation=page.status.generation,
        reason=page.status.reason,
        final=page.status.final,
    )


USER_ROUTES = (
    KernelsHandler,
    KernelAttachHandler,
    KernelFramesHandler,
    KernelInterruptHandler,
    KernelRestartHandler,
)
WORKER_ROUTES = (
    WorkerKernelConnectionHandler,
    WorkerKernelFramesHandler,
    WorkerKernelExitHandler,
)
