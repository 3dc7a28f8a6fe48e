"""A session on its worker (ADR 0019): the executor the agent runs, its life, and the agent's calls.

The agent makes one :class:`SessionExecutor` per assignment of a session's job, in place of a
:class:`~gpulayer_kernel.worker.executor.JobExecutor`, with the same life: ``run()`` returns the
job's :class:`FinishReport` when the session ends (stopped, idle, broken beyond use), ``cancel``
ends it. It holds three parts side by side: its attempt (``attempt.py``: the folder, workspace,
log shipper, the agent's calls queued, the life shared with a GPU kernel's executor), a rank
group (``ranks.py``: one process per local rank, started, read, stopped, restarted) and a cell
runner (``cells.py``: each cell on every local rank at once, one report at its end, the first
failing rank the root cause). The agent's calls (a cell, an interrupt, a restart, a stop) land
here and go through one queue, so cells and restarts happen in the order they came.

A session is *broken* when a rank dies or stays stuck in a collective after another failed:
further cells are refused with the reason until ``restart`` kills every rank and starts them
again (their state is lost).
"""

from __future__ import annotations

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import CellAssignment, FinishReport, Job, JobAssignment
from ..config import ExecutorConfig
from ..ports import PortReservations
from ..transport import Transport
from ..warm import WarmRunner
from .attempt import RESTART, STOP, SessionAttempt

# Re-exported: tests and callers name these here, where they were defined first.
from .cells import NEVER_CAME as NEVER_CAME
from .cells import RESTARTED_WHILE_RAN as RESTARTED_WHILE_RAN
from .cells import STOP_GRACE as STOP_GRACE
from .cells import CellRunner
from .ranks import RankGroup


class SessionExecutor:
    """One session's ranks on this worker, for one attempt of its job: its attempt, its rank
    group and its cells, held side by side (the worker's ``Executor`` protocol)."""

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
        self.at = SessionAttempt(assignment, transport, config, ports=ports, warm=warm, clock=clock)
        self.group = RankGroup(self.at)
        self.cells = CellRunner(self.at, self.group)

    @property
    def job(self) -> Job:
        return self.at.job

    # -- the agent's side ------------------------------------------------------------------------

    def cancel(self, reason: str = "stopped") -> None:
        self.at.cancel(reason)
        self.cells.drop_running()

    def submit(self, cell: CellAssignment) -> None:
        self.cells.submit(cell)

    def restart(self) -> None:
        """Kill every rank and start them again (a running cell is aborted; state is lost)."""
        self.at.restart()
        self.cells.drop_running()

    def interrupt(self) -> None:
        """KeyboardInterrupt in the running cell, on every local rank (no cell: nothing)."""
        self.cells.interrupt()

    def cleanup(self) -> None:
        self.at.cleanup()

    # -- life ------------------------------------------------------------------------------------

    async def run(self) -> FinishReport:
        return await self.at.live("session", self.group.start, self._serve, self.group.stop)

    async def _serve(self) -> None:
        """Run cells and restarts in order until the session is stopped (no task per item:
        a stop arrives through the queue too)."""
        at = self.at
        while not at.cancelled.is_set():
            item = await at.queue.get()
            if item == STOP:
                return
            if item == RESTART:
                await self.group.restart()
            elif isinstance(item, CellAssignment):
                await self.cells.run(item)
