"""A session that breaks says so in the cell that broke it (issue 23, item 4): rank 1 raises
before an ``all_reduce`` that rank 0 waits in; the cell's own output names rank 1 as the root
cause, says rank 0 is stuck in a collective so the session is broken, and gives the restart hint.
Two ranks on simulated GPUs (gloo on the CPU), real rank processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CellState, SessionStatus
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.sessions import SessionCellError
from gpulayer_kernel.worker.sessions.executor import STOP_GRACE

from ..conftest import WorkerFactory
from .conftest import run, spec, up

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(autouse=True)
def _torch_in_session_zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "torch")
    yield


async def test_the_cell_that_breaks_the_session_names_the_cause_and_the_mend(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, tmp_path: Path
) -> None:
    await gl_worker(gpus=2)
    await gl_cp.start_session(spec(gpus=2))
    await up(gl_cp, "s1", timeout=120)
    # A rank that fails without breaking the session: its cell says nothing of a restart.
    page = await run(
        gl_cp,
        "s1",
        "import time, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n    raise ValueError('bad batch')\ntime.sleep(30)\n",
    )
    assert page.cell.error is not None and page.cell.error.rank == 1
    assert page.cell.broken is None
    shown = "\n".join(SessionCellError(page.cell, "s1")._render_traceback_())
    assert "restart" not in shown and "broken" not in shown
    started = time.monotonic()
    # Rank 1 fails once rank 0 is in the collective: interrupted before it (a loaded machine
    # can be that slow), rank 0 would stop cleanly, and rightly nothing would be broken.
    entering = tmp_path / "rank0-enters-the-collective"
    page = await run(
        gl_cp,
        "s1",
        "import pathlib, time, torch, torch.distributed as dist\n"
        f"entering = pathlib.Path({str(entering)!r})\n"
        "if dist.get_rank() == 1:\n"
        "    while not entering.exists():\n        time.sleep(0.01)\n"
        "    time.sleep(0.5)\n"
        "    raise RuntimeError('rank 1 gives up')\n"
        "entering.touch()\n"
        "dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, forever\n",
    )
    # Not waited for forever: rank 0 is stuck once the grace after rank 1's failure is over.
    assert time.monotonic() - started < STOP_GRACE + 20
    cell = page.cell
    assert cell.state == CellState.ERROR
    assert cell.error is not None and cell.error.rank == 1
    assert cell.broken is not None
    assert "rank 1 failed first (the root cause)" in cell.broken
    assert "rank 0" in cell.broken and "stuck in a collective" in cell.broken
    assert "the session is broken" in cell.broken
    # What the notebook shows for this very cell: the root cause's traceback, then why the
    # session broke and how to mend it.
    shown = "\n".join(SessionCellError(cell, "s1")._render_traceback_())
    assert "[rank 1]" in shown and "RuntimeError" in shown and "rank 1 gives up" in shown
    assert "rank 0" in shown and "stuck in a collective" in shown
    assert "%gpulayer session restart s1" in shown
    err = SessionCellError(cell, "s1")
    assert "%gpulayer session restart s1" in (err.hint or "")
    # The stored record says the same (a notebook reading it later, `gpulayer sessions show`).
    stored = (await gl_cp.session_cells("s1"))[0]
    assert stored.number == cell.number and stored.broken == cell.broken
    info = await gl_cp.get_session("s1")
    assert info.status == SessionStatus.BROKEN
