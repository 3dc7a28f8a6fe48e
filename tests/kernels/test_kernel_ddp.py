"""DDP from a 2-GPU kernel, as on a local 2-GPU box (issue 33, "Also"; docs/kernels.md).

A GPU kernel is one ipykernel that sees all its GPUs; until multi-rank kernels exist (ADR 0021),
a notebook trains on both by spawning one process per GPU from a cell: ``accelerate``'s
``notebook_launcher`` or ``torch.multiprocessing``. Here the 2 GPUs are simulated, so the ranks
meet with gloo on the CPU; the cells are what a user types.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .conftest import Plane
from .test_kernel_e2e import run, start, texts

pytestmark = [pytest.mark.slow, pytest.mark.torch]
pytest.importorskip("torch")
pytest.importorskip("accelerate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TRAIN = """
import torch, torch.distributed as dist

def train(out):
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x = torch.full((8, 4), float(acc.process_index + 1))
    loss = model(x).pow(2).mean()
    acc.backward(loss)
    opt.step()
    total = torch.tensor([acc.process_index + 1.0])
    dist.all_reduce(total)
    weights = acc.unwrap_model(model).weight.detach().flatten().tolist()
    with open(f"{out}/rank{acc.process_index}.txt", "w") as f:
        f.write(f"{acc.num_processes} {dist.get_backend()} {total.item()} {weights}")
    print(f"rank {acc.process_index} of {acc.num_processes}: sum {total.item()}", flush=True)
"""

SPAWN = """
import os, torch, torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    with open(f"{out}/spawned{rank}.txt", "w") as f:
        f.write(f"{dist.get_world_size()} {t.item()}")
    dist.destroy_process_group()

# fork: the function lives in the notebook (__main__), which spawned children cannot import
mp.start_processes(rank_main, args=(2, PORT, OUT), nprocs=2, start_method="fork")
"""


async def test_a_2_gpu_kernel_trains_ddp_with_accelerates_notebook_launcher(
    gl_plane: Plane, tmp_path: Path
) -> None:
    out = tmp_path / "ddp"
    out.mkdir()
    km, kc = await start("gpulayer-2gpu")
    try:
        reply, _ = await run(kc, TRAIN)
        assert reply["content"]["status"] == "ok", reply["content"]
        launch = (
            "from accelerate import notebook_launcher\n"
            f"notebook_launcher(train, args=({str(out)!r},), num_processes=2,"
            f" use_port={free_port()})"
        )
        reply, shown = await run(kc, launch)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "Launching training on 2 CPUs" in texts(shown), texts(shown)
        for r in (0, 1):  # the ranks' own prints reach the cell, as on a local box
            assert f"rank {r} of 2: sum 3.0" in texts(shown), texts(shown)
        results = [(out / f"rank{r}.txt").read_text().split(" ", 3) for r in (0, 1)]
        for world, backend, total, _ in results:
            assert (world, backend, total) == ("2", "gloo", "3.0")
        assert results[0][3] == results[1][3]  # DDP averaged the gradients: the same weights

        # torch.multiprocessing from the same kernel, fork as accelerate does.
        code = SPAWN.replace("PORT", str(free_port())).replace("OUT", repr(str(out)))
        reply, _ = await run(kc, code)
        assert reply["content"]["status"] == "ok", reply["content"]
        for r in (0, 1):
            assert (out / f"spawned{r}.txt").read_text() == "2 3.0"
        # The kernel itself stays usable (its state kept) after its children are gone.
        _, shown = await run(kc, "print(train.__name__)")
        assert texts(shown).strip() == "train"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
