"""Check that ranks can talk: each adds rank + 1 into an all_reduce and checks the sum.

Run it with ``torchrun --nproc-per-node 2 examples/allreduce.py`` or as a GPUlayer distributed
job. It uses gloo so it runs on CPU-only machines too (NCCL needs one GPU per rank). Exits 1
on a wrong sum.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from gpulayer_kernel.torch import destroy_distributed, init_distributed, rank, world_size


def main() -> int:
    # Gloo even on GPUs: this checks the rendezvous and the network, not NCCL.
    init_distributed(backend="gloo")  # a no-op for a single process
    value = torch.tensor([float(rank() + 1)])
    if dist.is_initialized():
        dist.all_reduce(value)
    total, n = int(value.item()), world_size()
    expected = n * (n + 1) // 2
    # One write per line, so the ranks' lines do not interleave mid-line in a shared log.
    sys.stdout.write(f"rank {rank()}: sum = {total}\n")
    sys.stdout.flush()
    destroy_distributed()
    if total != expected:
        print(f"rank {rank()}: expected {expected}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
