"""Simulated GPUs (DESIGN rule 10): N devices of vendor ``sim`` whose maths runs on the CPU.

A worker started with ``--simulate-gpus N --simulate-kind a100-80gb`` advertises N devices of kind
``a100`` with 80 GiB each, ``simulated=True`` on its capabilities and on every placement that uses
them, so placement, gangs and torchrun run for real on a CPU-only machine while every surface says
"simulated". Gangs use gloo.
"""

from __future__ import annotations

from ..contracts import Device, WorkerCapabilities
from .kinds import GIB, parse_kind

DEFAULT_SIM_MEMORY = 16 * GIB  # when --simulate-kind carries no size ("h100")


def simulated_capabilities(
    n: int, kind: str = "a100-80gb", *, base: WorkerCapabilities | None = None
) -> WorkerCapabilities:
    """Capabilities with ``n`` simulated GPUs of ``kind``.

    ``base`` (a real probe's result) supplies host facts and frameworks, which stay honest: a
    simulated GPU does not make torch appear. Its real devices are replaced by the simulated ones.
    """
    if n < 0:
        raise ValueError(f"simulated GPU count must be >= 0, got {n}")
    parsed, memory = parse_kind(kind)
    memory = memory if memory is not None else DEFAULT_SIM_MEMORY
    size = f"{memory // GIB} GB" if memory % GIB == 0 else f"{memory / GIB:.1f} GB"
    name = f"Simulated {parsed.upper()} {size}"
    devices = [
        Device(
            index=i,
            vendor="sim",
            name=name,
            kind=parsed,
            memory_bytes=memory,
            uuid=f"SIM-{parsed}-{i}",
        )
        for i in range(n)
    ]
    base = base or WorkerCapabilities()
    sources = [s for s in base.probe_sources if s != "simulated"] + ["simulated"]
    return base.model_copy(
        update={
            "devices": devices,
            "simulated": bool(n) or base.simulated,
            "runtime": "sim" if n else base.runtime,
            "dist_backend": "gloo",
            "probe_sources": sources,
        }
    )
