"""A session on its worker (ADR 0019): the executor the agent runs, its life, and the agent's calls.

The agent makes one :class:`SessionExecutor` per assignment of a session's job, in place of a
:class:`~gpulayer_kernel.worker.executor.JobExecutor`, with the same life: ``run()`` returns the
job's :class:`FinishReport` when the session ends (stopped, idle, broken beyond use), ``cancel``
ends it. In between it keeps one process per local rank (``ranks.py``: started, read,
stopped, restarted) and runs the control plane's cells on them one at a time, in order
(``cells.py``: each cell on every local rank at once, one report at its end, the first
failing rank the root cause). The agent's calls (a cell, an interrupt, a restart, a stop) land
here and go through one queue, so cells and restarts happen in the order they came.

A session is *broken* when a rank dies or stays stuck in a collective after another failed:
further cells are refused with the reason until ``restart`` kills every rank and starts them
again (their state is lost).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import CellAssignment, CellReport, FinishReport, JobAssignment
from ...errors import GPUlayerError
from ...redact import Redactor
from ...workspace.remote import WorkerWorkspace
from ..config import ExecutorConfig
from ..control import ControlReader
from ..jobtoken import scoped_env
from ..launch import Launch
from ..logship import LogShipper
from ..ports import PortReservations
from ..processes import killpg
from ..transport import Transport
from ..warm import WarmRunner
from ..workspace import workspace_for

# Re-exported: tests and callers name these here, where they were defined first.
from .cells import NEVER_CAME as NEVER_CAME
from .cells import RESTARTED_WHILE_RAN as RESTARTED_WHILE_RAN
from .cells import STOP_GRACE as STOP_GRACE
from .cells import SessionCells
from .output import RankOutput
from .ranks import Rank

log = logging.getLogger("gpulayer.worker")

_STOP = "stop"  # queue items besides cells: the session ends, or restarts
_RESTART = "restart"


class SessionExecutor(SessionCells):
    """One session's ranks on this worker, for one attempt of its job."""

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
        node = assignment.node
        self.nproc = max(1, len(node.devices))
        self.world_size = self.nproc * assignment.nnodes
        self.rank_base = node.node_rank * self.nproc
        self.ranks: list[Rank] = []
        self.dir = config.work_root / "sessions" / f"{self.job.id}-{self.job.attempts}"
        if assignment.nnodes > 1:
            self.dir = self.dir.with_name(self.dir.name + f"-n{node.node_rank}")
        # The notebook's folder (ADR 0022): the ranks run in it, in place or synced; else here.
        self.cwd = self.dir
        self.scoped: dict[str, str] = {}  # GPULAYER_URL and a job token (worker/jobtoken.py)
        self.workspace: WorkerWorkspace | None = None
        if getattr(self.job.spec.workload, "workspace", None) is not None:
            self.workspace = workspace_for(self.job.id, transport, self.dir / "workspace")
        self.broken: str | None = None
        self.cell: int | None = None  # the cell running now (fd-level output is its)
        self._queue: asyncio.Queue[CellAssignment | str] = asyncio.Queue()
        self._cancel = asyncio.Event()
        self._cancel_reason = "stopped"
        self._restarting = asyncio.Event()  # a restart asked for: a running cell is dropped
        # Resolved by a stop or a restart while a cell runs: its wait ends at once.
        self._abort: asyncio.Future[None] | None = None
        self._interrupted = False
        self.output = RankOutput(self.shipper, self.redactor)
        self._control: ControlReader | None = None
        # What a restarted control plane asks about (``CellAssignment.resume``): the cells
        # queued here, the one being run or reported, every number taken, the last report.
        self._queued: set[int] = set()
        self._busy: int | None = None
        self._seen: set[int] = set()
        self._last: CellReport | None = None
        self._resumes: set[asyncio.Task[None]] = set()

    # -- the agent's side ------------------------------------------------------------------------

    def cancel(self, reason: str = "stopped") -> None:
        self._cancel_reason = reason
        self._cancel.set()
        self._queue.put_nowait(_STOP)
        self._drop_running_cell()

    def submit(self, cell: CellAssignment) -> None:
        if cell.resume:
            self._resume(cell)
            return
        self._queued.add(cell.number)
        self._queue.put_nowait(cell)

    def restart(self) -> None:
        """Kill every rank and start them again (a running cell is aborted; state is lost)."""
        self._restarting.set()
        self._queue.put_nowait(_RESTART)
        self._drop_running_cell()

    def _drop_running_cell(self) -> None:
        if self._abort is not None and not self._abort.done():
            self._abort.set_result(None)

    def interrupt(self) -> None:
        """KeyboardInterrupt in the running cell, on every local rank (no cell: nothing)."""
        if self.cell is None:
            return
        self._interrupted = True
        for r in self.ranks:
            killpg(r.proc.pid, signal.SIGINT)

    def cleanup(self) -> None:
        """Nothing stays on disk after its end (the agent calls this off the hot path)."""
        import shutil

        if not self.config.keep_job_dirs:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _send_logs(self, lines: list[Any]) -> None:
        await self.transport.append_logs(self.job.id, lines)

    # -- life ------------------------------------------------------------------------------------

    # A GPU kernel (``kernel.py``) lives the same life with its own start, serve and stop.
    WHAT = "session"  # the word a user reads when it cannot start

    async def run(self) -> FinishReport:
        try:
            try:
                await self._prepare_workspace()
                await self._start()
            except GPUlayerError as exc:
                what = f"the {self.WHAT} could not start"
                self.system(f"{what}: {exc.message}")
                return FinishReport(state="failed", reason=f"{what}: {exc}")
            if self._cancel.is_set():
                return FinishReport(state="cancelled", reason=self._cancel_reason)
            await self._report_started()
            await self._serve()
            return FinishReport(state="cancelled", reason=self._cancel_reason)
        except asyncio.CancelledError:
            await self._stop()
            raise
        except Exception as exc:
            log.exception("%s %s crashed its executor", self.WHAT, self.job.id)
            return FinishReport(state="failed", reason=f"worker error: {exc!r}")
        finally:
            await self._stop()
            if self.workspace is not None:
                await self.workspace.close()
            self.launch.close()
            if self._control is not None:
                self._control.close()
            await self.shipper.close()

    async def _prepare_workspace(self) -> None:
        """Where the ranks run: the notebook's folder in place, a synced copy, or here; and
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

    async def _start(self) -> None:
        await self._start_ranks()

    async def _stop(self) -> None:
        await self._stop_ranks()

    async def _serve(self) -> None:
        """Run cells and restarts in order until the session is stopped (no task per item:
        a stop arrives through the queue too)."""
        while not self._cancel.is_set():
            item = await self._queue.get()
            if item is _STOP:
                return
            if item is _RESTART:
                await self._restart()
            elif isinstance(item, CellAssignment):
                await self._run_cell(item)
