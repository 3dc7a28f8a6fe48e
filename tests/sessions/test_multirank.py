"""Multi-rank sessions on simulated GPUs (gloo on the CPU): one process per rank, the process group
made once, every cell on every rank; a failing rank interrupts the others and is named."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpulayer_kernel.contracts import CellState, SessionStatus
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.sessions import SessionCellError
from gpulayer_kernel.testing import until

from ..conftest import WorkerFactory
from .conftest import run, spec, up

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(autouse=True)
def _torch_in_session_zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "torch")
    yield


def text(page: object) -> str:
    return page.cell.value["data"]["text/plain"]  # type: ignore[attr-defined,no-any-return]


async def test_a_ddp_model_built_in_one_cell_trains_in_the_next(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(gpus=2)
    info = await gl_cp.start_session(spec(gpus=2))
    info = await up(gl_cp, "s1", timeout=120)
    assert info.ranks == 2
    group = await run(
        gl_cp, "s1", "import torch.distributed as dist\n(dist.get_rank(), dist.get_world_size())"
    )
    assert text(group) == "(0, 2)"
    every = await run(gl_cp, "s1", "dist.get_rank()", all_ranks=True)
    assert [r.value["data"]["text/plain"] for r in every.cell.ranks] == ["0", "1"]  # type: ignore[index]
    await run(
        gl_cp,
        "s1",
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x = torch.randn(64, 4) + dist.get_rank()\ny = x.sum(1, keepdim=True)\n",
    )
    trained = await run(
        gl_cp,
        "s1",
        "for _ in range(20):\n    opt.zero_grad()\n"
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n"
        "    opt.step()\nprint(f'loss {loss.item():.3f}')\n",
    )
    assert trained.cell.state == CellState.OK
    assert {r.rank for r in trained.records if r.text.startswith("loss")} == {0, 1}
    # DDP keeps the replicas equal: the weights agree on both ranks.
    weights = await run(
        gl_cp, "s1", "[round(v, 5) for v in model.module.weight.flatten().tolist()]", all_ranks=True
    )
    shown = [r.value["data"]["text/plain"] for r in weights.cell.ranks]  # type: ignore[index]
    assert shown[0] == shown[1]


async def test_a_failing_rank_is_the_root_cause_and_the_session_stays_usable(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(gpus=2)
    await gl_cp.start_session(spec(gpus=2))
    await up(gl_cp, "s1", timeout=120)
    await run(gl_cp, "s1", "import time, torch.distributed as dist\nkept = 1")
    page = await run(
        gl_cp,
        "s1",
        "if dist.get_rank() == 1:\n    raise ValueError('bad batch on rank 1')\n"
        "for _ in range(600):\n    time.sleep(0.05)\n",
    )
    assert page.cell.state == CellState.ERROR
    assert page.cell.error is not None and page.cell.error.rank == 1
    assert page.cell.error.ename == "ValueError"
    statuses = {r.rank: (r.status, r.error.ename if r.error else None) for r in page.cell.ranks}
    assert statuses == {0: ("error", "KeyboardInterrupt"), 1: ("error", "ValueError")}
    assert text(await run(gl_cp, "s1", "kept")) == "1"


async def test_a_rank_stuck_in_a_collective_breaks_the_group_and_restart_mends_it(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(gpus=2)
    await gl_cp.start_session(spec(gpus=2))
    await up(gl_cp, "s1", timeout=120)
    page = await run(
        gl_cp,
        "s1",
        "import torch, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n    raise RuntimeError('rank 1 gives up')\n"
        "dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, forever\n",
    )
    assert page.cell.error is not None and page.cell.error.rank == 1
    info = await gl_cp.get_session("s1")
    assert info.status == SessionStatus.BROKEN
    assert "did not stop" in (info.reason or "") and "collective" in (info.reason or "")
    await gl_cp.restart_session("s1")
    await up(gl_cp, "s1", timeout=120)
    again = await run(
        gl_cp,
        "s1",
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()",
    )
    assert text(again) == "2.0"

    async def two_cells_later() -> bool:
        return (await gl_cp.get_session("s1")).cells >= 2

    await until(two_cells_later, what="the restarted session to count its cells")


async def test_a_two_node_session_is_one_process_group_across_its_workers(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker("w1", gpus=1)
    await gl_worker("w2", gpus=1)
    await gl_cp.start_session(spec(gpus=1, nodes=2))
    info = await up(gl_cp, "s1", timeout=120)
    assert info.ranks == 2
    every = await run(
        gl_cp,
        "s1",
        "import os, torch, torch.distributed as dist\nt = torch.ones(1) * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n(dist.get_rank(), os.environ['GROUP_RANK'], t.item())",
        all_ranks=True,
    )
    shown = [r.value["data"]["text/plain"] for r in every.cell.ranks]  # type: ignore[index]
    assert shown == ["(0, '0', 3.0)", "(1, '1', 3.0)"]


async def test_running_out_of_gpu_memory_is_the_cells_error_and_the_session_survives(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    # No GPU here: the cell raises the error torch raises for a CUDA OOM, as a cell whose
    # allocation failed would (torch survives an OOM; the session does too).
    await gl_worker(gpus=1)
    await gl_cp.start_session(spec(gpus=1))
    await up(gl_cp, "s1", timeout=120)
    await run(gl_cp, "s1", "import torch\nkept = torch.ones(2)")
    page = await run(
        gl_cp,
        "s1",
        "raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB')",
    )
    assert page.cell.state == CellState.ERROR and page.cell.error is not None
    assert page.cell.error.ename == "OutOfMemoryError"
    assert "Tried to allocate 80.00 GiB" in page.cell.error.evalue
    assert (await gl_cp.get_session("s1")).status == SessionStatus.IDLE
    assert text(await run(gl_cp, "s1", "kept.sum().item()")) == "2.0"
    # The notebook's error says what to do about it.
    hint = SessionCellError(page.cell, "s1").hint or ""
    assert "ran out of memory" in hint and "torch.cuda.empty_cache()" in hint
