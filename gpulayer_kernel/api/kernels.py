"""The GPU kernel routes of ``/api/v1`` (ADR 0021): the Jupyter host's under ``/kernels``, the
worker's under ``/worker/jobs/{job_id}/kernel``. Thin: parse the contract, call the control plane's
kernel relay, answer a contract. ``{kernel}`` is the kernel's session id. A kernel is stopped,
listed and explained as the session it is (``/sessions``).
"""

from __future__ import annotations

from ..contracts import SessionInfo
from ..contracts.kernels import KernelConnection, KernelExit, KernelFrames, KernelPage, KernelStart
from ..controlplane.sessions.kernels import relay_for
from ..errors import NotFound
from ..security import Role
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
        return await relay_for(self.cp).start(body, who=self.who)


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
        return await relay_for(self.cp).attach(kernel, body, who=self.who)


class KernelFramesHandler(GLMixin):
    route = "/kernels/{kernel}/frames"

    @op(
        "messages for the kernel (shell, control, stdin), relayed unchanged",
        body=KernelFrames,
        answer=None,
        status=204,
        errors=(403, 404, 422),
        role=Role.USER,
    )
    async def post(self, kernel: str, body: KernelFrames) -> None:
        await relay_for(self.cp).send(kernel, list(body.frames), who=self.who)

    @op(
        "the kernel's messages after `since` (long-poll with `wait`), and its state",
        answer=KernelPage,
        query=(SINCE, WAIT),
        errors=(403, 404),
        role=Role.USER,
    )
    async def get(self, kernel: str, since: float, wait: float) -> KernelPage:
        call = relay_for(self.cp).receive(kernel, int(since), wait, who=self.who)
        return await self.long_poll(wait, call)


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
        await relay_for(self.cp).interrupt(kernel, who=self.who)


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
        return await relay_for(self.cp).restart(kernel, body, who=self.who)


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
        conn = await self.long_poll(wait, relay_for(self.cp).connection(job_id, wait))
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
        call = relay_for(self.cp).worker_receive(job_id, int(since), wait)
        return await self.long_poll(wait, call)

    @op(
        "the kernel's messages (iopub, and replies on shell, control and stdin)",
        body=KernelFrames,
        answer=None,
        status=204,
        errors=(404,),
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: KernelFrames) -> None:
        await relay_for(self.cp).worker_send(job_id, list(body.frames))


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
        await relay_for(self.cp).worker_exited(job_id, body)


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
