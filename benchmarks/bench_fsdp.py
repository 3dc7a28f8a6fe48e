"""The Trainer's ``strategy="fsdp"`` against a hand-written ``fully_shard`` loop of the same model.

Usage (the ranks are torchrun's; one process makes a one-rank group, still sharded by FSDP)::

    .venv/bin/python -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_fsdp.py --quick
    torchrun --nproc-per-node 2 benchmarks/bench_fsdp.py --gpu     # NCCL, bf16, a GPT-style model

Both contenders shard the same units (each block, then the root), use AdamW, and train on the
same per-rank batches from the same initial weights; each round runs both (alternating which
goes first) and times from the fetch of batch ``warm`` to the last (bench_trainer's method).
Rank zero prints the median samples/s of each, the median per-round ratio trainer/hand, and
whether the two ended with the same parameters (they must: the same maths).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout
sys.path.insert(0, str(HERE))

from bench_trainer import TimedBatches  # noqa: E402

from gpulayer_kernel.torch import Module, Trainer, TrainerConfig  # noqa: E402


class Blocks(torch.nn.Module):
    """Residual MLP blocks: the FSDP units, as a transformer's layers would be."""

    def __init__(self, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
            for _ in range(depth)
        )
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        out: torch.Tensor = self.head(x)
        return out


class Wrapped(Module):
    def __init__(self, net: Blocks) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def fsdp_units(self) -> list[torch.nn.Module]:
        return list(self.net.blocks)


def hand(net: Blocks, data: TimedBatches, steps: int, device: torch.device, bf16: bool) -> Any:
    """The loop a user writes with torch's fully_shard directly."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=bf16)
    step = 0
    for x, y in data:
        with autocast:
            loss = F.cross_entropy(net(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step == steps:
            break
    return net


def trainer(net: Blocks, data: TimedBatches, steps: int, device: torch.device, bf16: bool) -> Any:
    module = Wrapped(net)
    config = TrainerConfig(
        max_steps=steps,
        strategy="fsdp",
        precision="bf16-mixed" if bf16 else "32",
        checkpoint_at_end=False,
        seed=0,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(config, loggers=[]).fit(module, data)
    return net


def full_state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, torch.Tensor] = get_model_state_dict(net, options=options)
    return state


def join_group(device: torch.device) -> None:
    """torchrun's group, or a one-rank group of this process (FSDP still shards over it)."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:
        from gpulayer_kernel.torch.testing import free_port

        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    parser.add_argument("--gpu", action="store_true", help="NCCL and bf16 on CUDA")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    if args.gpu and not torch.cuda.is_available():
        print("--gpu skipped: CUDA is not available on this machine")
        return 0
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if args.gpu else torch.device("cpu")
    join_group(device)
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    width, depth, batch = (2048, 8, 32) if args.gpu else (256, 4, 32)
    rounds = args.rounds or (2 if args.quick else 8)
    steps = args.steps or (10 if args.quick else 40)
    warm = 2 if args.quick else 5
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the data
    batches = [
        (
            torch.randn(batch, width, generator=generator).to(device),
            torch.randint(0, 10, (batch,), generator=generator).to(device),
        )
        for _ in range(steps)
    ]
    contenders = {"hand": hand, "trainer": trainer}
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    same = True
    for round_ in range(rounds + 1):  # the first round warms up, unrecorded
        ended = {}
        order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
        for name in order:
            torch.manual_seed(0)
            net = Blocks(width, depth, 10).to(device)
            data = TimedBatches(batches, device, warm, steps - 1)
            ended[name] = full_state(contenders[name](net, data, steps, device, args.gpu))
            if round_:
                seconds = data.times[steps - 1] - data.times[warm]
                rates[name].append((steps - 1 - warm) * batch * world / seconds)
        if rank == 0:
            a, b = ended["hand"], ended["trainer"]
            same = same and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    if rank == 0:
        what = f"{'cuda bf16' if args.gpu else 'cpu fp32'}, {world} rank(s)"
        print(f"fsdp: residual MLP {depth}x{width}, batch {batch}/rank, {what}, {rounds} rounds")
        for name, values in rates.items():
            print(f"fsdp: {name} {statistics.median(values):,.0f} samples/s")
        ratios = [t / h for t, h in zip(rates["trainer"], rates["hand"], strict=True)]
        print(
            f"fsdp: trainer/hand {statistics.median(ratios):.3f}x "
            f"(per-round {min(ratios):.3f}-{max(ratios):.3f})"
        )
        print(f"fsdp: same parameters as the hand-written loop: {'yes' if same else 'NO'}")
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
