"""GPU capabilities: the probe, kind names, simulated GPUs and the support matrix (ADR 0005, 0006).

``run_probe`` runs ``python -m gpulayer_kernel.capabilities.probe`` in an isolated subprocess and
returns ``WorkerCapabilities`` whatever happens; ``simulated_capabilities`` makes N simulated GPUs;
``worker_support`` reads capabilities against the one support matrix the scheduler enforces.
"""

from __future__ import annotations

from .kinds import normalize_kind, parse_kind
from .readers import parse_nvidia_smi, probe, read_host, read_nvml, read_torch
from .run import run_probe
from .simulated import simulated_capabilities
from .support import SUPPORT_MATRIX, WorkerSupport, job_refusal, matrix_markdown, worker_support

__all__ = [
    "SUPPORT_MATRIX",
    "WorkerSupport",
    "job_refusal",
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
