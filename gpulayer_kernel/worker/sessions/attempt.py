"""What a session's or a GPU kernel's executor holds for one attempt of its job (ADR 0019, 0021).

Both executors (``executor.py``'s :class:`SessionExecutor`, ``kernel.py``'s
:class:`KernelExecutor`) are siblings over one :class:`SessionAttempt`, held by composition: the
assignment and its transport, the log shipper and redactor, the folder and the workspace it runs
in (ADR 0022), the job token's scoped environment, the agent's calls queued in order (a stop, a
restart; a session's cells), and the life every one of them lives (``live``): prepare the
workspace, start, say it started, serve until stopped, stop, and close what it opened, with one
:class:`FinishReport` at the end. What differs (IPython ranks and their cells; one relayed
ipykernel) is the start, serve and stop each executor hands to ``live``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import CellAssignment, FinishReport, JobAssignment, SessionReport
from ...errors import GPUlayerError
from ...job import CONTROL_ENV, JOB_ID_ENV, OUTPUT_ENV, RESULT_ENV
from ...redact import Redactor
from ...workspace.remote import WorkerWorkspace
from ..config import ExecutorConfig
from ..env import base_env, job_env
from ..jobproc import PACKAGE_ROOT
from ..jobtoken import scoped_env
from ..launch import Launch, device_env
from ..logship import LogShipper
from ..ports import PortReservations
from ..transport import Transport
from ..warm import WarmRunner
from ..workspace import workspace_for

log = logging.getLogger("gpulayer.worker")

STOP = "stop"  # queue items besides cells: the attempt ends, or restarts
RESTART = "restart"

Item = CellAssignment | str


class SessionAttempt:
    """One attempt of a session's (or GPU kernel's) job on this worker: its context and life."""

    def __init__(
        self,
        assignment: JobAssignment,
        transport: Transport,
        config: ExecutorConfig,
        *,
        ports: PortReservations,
        warm: WarmRunner | None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.a = assignment
        self.job = assignment.job
        self.transport = transport
        self.config = config
        self.warm = warm
        self.clock = clock
        self.redactor = Redactor(assignment.secrets)
        self.shipper = LogShipper(self._send_logs, self.redactor, clock=clock)
        self.launch = Launch(assignment, transport, config, self.system, ports=ports, clock=clock)
        self.dir = config.work_root / "sessions" / f"{self.job.id}-{self.job.attempts}"
        if assignment.nnodes > 1:
            self.dir = self.dir.with_name(self.dir.name + f"-n{assignment.node.node_rank}")
        # The notebook's folder (ADR 0022): the processes run in it, in place or synced; else here.
        self.cwd = self.dir
        self.scoped: dict[str, str] = {}  # GPULAYER_URL and a job token (worker/jobtoken.py)
        self.workspace: WorkerWorkspace | None = None
        if getattr(self.job.spec.workload, "workspace", None) is not None:
            self.workspace = workspace_for(self.job.id, transport, self.dir / "workspace")
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.cancelled = asyncio.Event()
        self.cancel_reason = "stopped"
        self.restarting = asyncio.Event()  # a restart asked for: a running cell is dropped
        self.closing: list[Callable[[], None]] = []  # what the body opened, closed at the end

    # -- the agent's calls, in the order they came -----------------------------------------------

    def cancel(self, reason: str) -> None:
        self.cancel_reason = reason
        self.cancelled.set()
        self.queue.put_nowait(STOP)

    def restart(self) -> None:
        self.restarting.set()
        self.queue.put_nowait(RESTART)

    def system(self, text: str) -> None:
        self.shipper.add("system", text)

    def cleanup(self) -> None:
        """Nothing stays on disk after its end (the agent calls this off the hot path)."""
        import shutil

        if not self.config.keep_job_dirs:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- life ------------------------------------------------------------------------------------

    async def live(
        self,
        what: str,
        start: Callable[[], Awaitable[None]],
        serve: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None]],
    ) -> FinishReport:
        """Start, serve until stopped, stop: the attempt's one report (``what`` is the word a
        user reads when it cannot start: "session", "kernel")."""
        try:
            try:
                await self._prepare_workspace()
                await start()
            except GPUlayerError as exc:
                why = f"the {what} could not start"
                self.system(f"{why}: {exc.message}")
                return FinishReport(state="failed", reason=f"{why}: {exc}")
            if self.cancelled.is_set():
                return FinishReport(state="cancelled", reason=self.cancel_reason)
            await self._report_started()
            await serve()
            return FinishReport(state="cancelled", reason=self.cancel_reason)
        except asyncio.CancelledError:
            await stop()
            raise
        except Exception as exc:
            log.exception("%s %s crashed its executor", what, self.job.id)
            return FinishReport(state="failed", reason=f"worker error: {exc!r}")
        finally:
            await stop()
            if self.workspace is not None:
                await self.workspace.close()
            self.launch.close()
            for close in self.closing:
                close()
            await self.shipper.close()

    async def _prepare_workspace(self) -> None:
        """Where the processes run: the notebook's folder in place, a synced copy, or here; and
        how the code reaches this control plane (a job token)."""
        self.scoped = scoped_env(self.transport, self.a)
        if self.workspace is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        where = await self.workspace.prepare()
        plan = self.workspace.plan
        if where is not None and plan is not None:
            self.cwd = where
            self.scoped["GPULAYER_WORKSPACE"] = plan.mode  # %gpulayer pull reads it
            self.system(f"workspace {plan.mode.replace('_', ' ')}: {where} ({plan.reason})")
        elif self.workspace.note:
            self.system(self.workspace.note)

    async def _report_started(self) -> None:
        try:
            await self.transport.report_started(self.job.id)
        except GPUlayerError as exc:
            self.cancel(exc.message)  # stopped or moved on between placement and start

    # -- what a rank's process gets --------------------------------------------------------------

    def rank_env(
        self,
        rank: int,
        local: int,
        *,
        nproc: int,
        world_size: int,
        master: tuple[str, int] | None,
    ) -> dict[str, str]:
        """One rank's environment: the allow-listed base, the job's env and secrets, its GPUs,
        the process group's rendezvous and this control plane's address (ADR 0022)."""
        spec = self.job.spec
        out = self.dir / "output"
        gl_env = {
            JOB_ID_ENV: self.job.id,
            "GPULAYER_JOB_NAME": spec.name,
            "GPULAYER_SESSION": self.job.id,
            "GPULAYER_ATTEMPT": str(self.job.attempts),
            OUTPUT_ENV: str(out / f"rank{rank}" if world_size > 1 else out),
            RESULT_ENV: str(self.dir / "result.json"),
            CONTROL_ENV: str(self.dir / "control.fifo"),
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(self.a.node.node_rank),
            "PYTHONPATH": PACKAGE_ROOT,
        }
        if master is not None:
            gl_env["MASTER_ADDR"], gl_env["MASTER_PORT"] = master[0], str(master[1])
        gl_env.update(device_env(self.a))
        gl_env.update(self.scoped)  # the control plane that placed it (ADR 0022)
        env = job_env(
            base_env(extra_allowed=self.config.extra_env_allowed),
            spec.env,
            self.a.secrets,
            gl_env,
        )
        if world_size > 1:
            # Share the host's cores between this node's ranks, unless the session chose.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        return env

    # -- reports ---------------------------------------------------------------------------------

    async def report_session(self, status: str, reason: str | None) -> None:
        report = SessionReport(status=status, reason=reason)
        with contextlib.suppress(GPUlayerError):
            await self.transport.report_session(self.job.id, report)

    async def report_progress(self, fields: dict[str, Any]) -> None:
        await self.transport.report_progress(self.job.id, self.redactor.redact_json(fields))

    async def _send_logs(self, lines: list[Any]) -> None:
        await self.transport.append_logs(self.job.id, lines)
