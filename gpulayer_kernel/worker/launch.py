"""How a job's processes are launched on its devices: plain, or through torchrun (ADR 0007).

A job on one device (or none) runs its argv as it is. A gang job runs under PyTorch's own launcher,
``torchrun``, with a static rendezvous: on one host ``--nnodes 1 --nproc-per-node N`` on a port this
worker picked free; across hosts, the rank-0 worker publishes its advertised address and a free
port to the control plane and the other workers long-poll for that record, then start their own
torchrun with their ``--node-rank``. ``CUDA_VISIBLE_DEVICES`` names exactly the placed devices.
"""

from __future__ import annotations

import re
import socket
import sys
from typing import TYPE_CHECKING

from ..contracts import JobAssignment, PythonWorkload, Rendezvous
from ..errors import GPUlayerError

if TYPE_CHECKING:
    from .executor import ExecutorConfig
    from .logship import LogShipper
    from .transport import Transport

# torchrun --tee 3 prefixes every line with "[default<local rank>]:"; rank tags look like "[rank1]:"
_RANK_PREFIX = re.compile(r"^\[(?:default|rank)(\d+)\]:(.*)$")


def is_gang(a: JobAssignment) -> bool:
    return a.job.spec.is_gang and not a.node.cpu_fallback


def device_env(a: JobAssignment) -> dict[str, str]:
    """Which devices the job may see. Simulated and CPU-fallback jobs see no CUDA device."""
    node = a.node
    env = {"GPULAYER_DEVICES": ",".join(map(str, node.devices))}
    if node.simulated or node.cpu_fallback or not node.devices:
        env["CUDA_VISIBLE_DEVICES"] = ""
        if node.simulated:
            env["GPULAYER_SIMULATED"] = "1"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.devices))
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def wrap(
    a: JobAssignment,
    argv: list[str],
    env: dict[str, str],
    transport: Transport,
    config: ExecutorConfig,
) -> list[str]:
    """The argv to spawn: the job's own, or torchrun around it for a gang."""
    if not is_gang(a):
        env.setdefault("RANK", "0")
        env.setdefault("WORLD_SIZE", "1")
        env.setdefault("LOCAL_RANK", "0")
        return argv
    nproc = max(1, len(a.node.devices))
    if a.nnodes == 1:
        addr, port = "127.0.0.1", free_port()
    elif a.node.node_rank == 0:
        addr = config.advertise_addr
        port = free_port(addr)
        await transport.publish_rendezvous(a.job.id, Rendezvous(master_addr=addr, master_port=port))
    else:
        try:
            rdzv = await transport.get_rendezvous(a.job.id, wait=config.rendezvous_timeout)
        except GPUlayerError as exc:
            raise GPUlayerError(
                f"rendezvous did not complete within {config.rendezvous_timeout:.0f}s: "
                f"{exc.message}",
                hint="check that the rank-0 worker is reachable at its --advertise-addr",
            ) from None
        addr, port = rdzv.master_addr, rdzv.master_port
    launcher = [
        config.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={a.nnodes}",
        f"--nproc-per-node={nproc}",
        f"--node-rank={a.node.node_rank}",
        f"--master-addr={addr}",
        f"--master-port={port}",
        "--tee=3",
        "--max-restarts=0",
    ]
    env["GPULAYER_WORLD_SIZE"] = str(nproc * a.nnodes)
    if isinstance(a.job.spec.workload, PythonWorkload):
        # argv is [python, -m, gpulayer_kernel.runner, entry]: torchrun runs modules with -m.
        return [*launcher, "-m", *argv[2:]]
    if argv[0] in ("python", "python3") or argv[0] == sys.executable:
        return [*launcher, *argv[1:]]
    return [*launcher, "--no-python", *argv]


def rank_splitter(a: JobAssignment):  # type: ignore[no-untyped-def]
    """A function that takes a torchrun-prefixed line apart into (global rank, text)."""
    if not is_gang(a):
        return None
    nproc = max(1, len(a.node.devices))
    base = a.node.node_rank * nproc

    def split(text: str) -> tuple[int | None, str]:
        m = _RANK_PREFIX.match(text)
        if m is None:
            return None, text
        return base + int(m.group(1)), m.group(2)

    return split


def failure_reason(a: JobAssignment, code: int | None, shipper: LogShipper) -> str | None:
    """For a gang, name the first failing rank (torchrun reports it in its error summary)."""
    return None
