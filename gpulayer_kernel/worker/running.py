"""What the worker's agent runs for each attempt it holds: an :class:`Executor`.

Three siblings, none built on another: a job's (``executor.py``'s ``JobExecutor``: one process,
its output, its end), a session's (``sessions/executor.py``: an attempt, a rank group and a cell
runner held side by side) and a GPU kernel's (``sessions/kernel.py``: an attempt and one relayed
ipykernel). The agent needs only this protocol from each; a session and a kernel also take the
control plane's interrupts and restarts (:class:`Steered`), and only a session takes cells.
"""

from __future__ import annotations

from typing import Protocol

from ..contracts import FinishReport, Job


class Executor(Protocol):
    """One attempt of one job on this worker."""

    @property
    def job(self) -> Job: ...

    async def run(self) -> FinishReport:
        """Run the attempt to its end: the job's one report."""
        ...

    def cancel(self, reason: str = ...) -> None:
        """End it (a stop, a stale attempt, a superseded one); ``run`` returns soon after."""
        ...

    def cleanup(self) -> None:
        """Remove what it left on disk (called off the hot path, after its report)."""
        ...


class Steered(Executor, Protocol):
    """An executor whose process lives across calls: a session's ranks, a GPU kernel."""

    def interrupt(self) -> None: ...

    def restart(self) -> None: ...
