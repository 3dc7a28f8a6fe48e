"""GPU capabilities: the probe, kind names, simulated GPUs and the support matrix (ADR 0005, 0006).

``local_capabilities`` answers for a local worker without importing torch on the way (the
per-machine cache, or the driver's devices now and the full probe in the background);
``run_probe`` runs ``python -m gpulayer_kernel.capabilities.probe`` in an isolated subprocess and
returns ``WorkerCapabilities`` whatever happens; ``simulated_capabilities`` makes N simulated GPUs;
``worker_support`` reads capabilities against the one support matrix the scheduler enforces.

The names are imported on first use: the probe program and the driver readers run in processes
that must not pay for the rest (``python -m gpulayer_kernel.capabilities.probe`` would otherwise
import everything here before it starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .host import read_host
    from .kinds import normalize_kind, parse_kind
    from .local import LocalProbe, local_capabilities
    from .readers import parse_nvidia_smi, probe, read_nvml, read_torch
    from .run import run_probe
    from .simulated import simulated_capabilities
    from .support import (
        SUPPORT_MATRIX,
        WorkerSupport,
        job_refusal,
        matrix_markdown,
        worker_support,
    )

_LAZY = {
    "LocalProbe": "local",
    "SUPPORT_MATRIX": "support",
    "WorkerSupport": "support",
    "job_refusal": "support",
    "local_capabilities": "local",
    "matrix_markdown": "support",
    "normalize_kind": "kinds",
    "parse_kind": "kinds",
    "parse_nvidia_smi": "readers",
    "probe": "readers",
    "read_host": "host",
    "read_nvml": "readers",
    "read_torch": "readers",
    "run_probe": "run",
    "simulated_capabilities": "simulated",
    "worker_support": "support",
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "LocalProbe",
    "SUPPORT_MATRIX",
    "WorkerSupport",
    "job_refusal",
    "local_capabilities",
    "matrix_markdown",
    "normalize_kind",
    "parse_kind",
    "parse_nvidia_smi",
    "probe",
    "read_host",
    "read_nvml",
    "read_torch",
    "run_probe",
    "simulated_capabilities",
    "worker_support",
]
