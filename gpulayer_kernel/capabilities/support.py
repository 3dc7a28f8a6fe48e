"""The support matrix (ADR 0005, 0006, 0015), written once and enforced in code.

``SUPPORT_MATRIX`` is the table; ``docs/support-matrix.md`` embeds ``matrix_markdown()`` verbatim
(a test keeps the two equal). ``worker_support`` reads a worker's capabilities against the table and
says which devices are usable, what GPU jobs run on (``runtime``) and whether gangs may run there;
the scheduler's feasibility stage calls it (through a per-capabilities cache) and ``job_refusal``
for the per-job rules (distributed work on Apple MPS is refused with ``Reason.MPS_DISTRIBUTED``).

A GPU is usable when its driver is: the probe lists NVIDIA devices from NVML or ``nvidia-smi`` even
without torch. Frameworks are reported, never assumed, except where the only way to drive the device
is the framework itself (Apple MPS needs torch's MPS backend; AMD needs torch built for ROCm).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts import Device, Frameworks, Reason, WorkerCapabilities
from ..contracts.workers import Runtime


@dataclass(frozen=True, slots=True)
class VendorSupport:
    """One row of the support matrix."""

    vendor: str  # Device.vendor, or "cpu" for a worker without accelerators
    label: str
    status: str
    jobs: str
    distributed: str
    requires: str
    memory: str


SUPPORT_MATRIX: tuple[VendorSupport, ...] = (
    VendorSupport(
        vendor="nvidia",
        label="NVIDIA (CUDA)",
        status="supported",
        jobs="all jobs",
        distributed="yes: gangs and multi-node (NCCL)",
        requires="a working driver (NVML or `nvidia-smi`); torch with CUDA for PyTorch jobs",
        memory="per device",
    ),
    VendorSupport(
        vendor="amd",
        label="AMD (ROCm)",
        status="reported; usable only when torch ROCm works",
        jobs="all jobs, once torch reports a HIP build with `cuda.is_available()`",
        distributed="yes, with torch ROCm (RCCL through the `nccl` backend)",
        requires="torch built for ROCm (`torch.version.hip`); otherwise `unsupported_vendor`",
        memory="per device",
    ),
    VendorSupport(
        vendor="apple",
        label="Apple silicon (Metal / MPS)",
        status="supported for independent single-device jobs",
        jobs="`gpus=1`, `nodes=1`",
        distributed="refused: `mps_distributed` (no NCCL on MPS; see ADR 0006)",
        requires="torch with `backends.mps.is_available()`; otherwise `unsupported_vendor`",
        memory="unified: the device reports the host's memory, shared with the CPU",
    ),
    VendorSupport(
        vendor="cpu",
        label="CPU only",
        status="supported",
        jobs='CPU jobs (`gpus=0`); GPU jobs that asked `fallback=["cpu"]`',
        distributed="CPU fallback gangs use gloo",
        requires="nothing",
        memory="host",
    ),
    VendorSupport(
        vendor="sim",
        label="Simulated GPUs (`--simulate-gpus N`)",
        status="supported for development and tests; always shown as simulated",
        jobs="everything: placement, gangs and torchrun run for real",
        distributed="yes: the maths runs on the CPU with gloo",
        requires="torch for PyTorch jobs",
        memory="as simulated (`--simulate-kind a100-80gb` gives 80 GiB)",
    ),
)


def matrix_markdown() -> str:
    """The support matrix as the Markdown table that ``docs/support-matrix.md`` embeds."""
    head = "| vendor | status | jobs | distributed | requires | memory |"
    rule = "| --- | --- | --- | --- | --- | --- |"
    rows = [
        f"| {r.label} | {r.status} | {r.jobs} | {r.distributed} | {r.requires} | {r.memory} |"
        for r in SUPPORT_MATRIX
    ]
    return "\n".join([head, rule, *rows]) + "\n"


@dataclass(frozen=True, slots=True)
class Unusable:
    """A reported device the worker will not run jobs on, and why."""

    device: Device
    reason: Reason
    why: str


@dataclass(frozen=True, slots=True)
class WorkerSupport:
    """What a worker's capabilities allow, per the support matrix."""

    usable: tuple[Device, ...]
    unusable: tuple[Unusable, ...]
    runtime: Runtime
    dist_backend: str | None  # "nccl", "gloo" or None (no gangs on this worker's GPUs)
    single_device_only: bool  # Apple MPS: gangs and multi-node refused
    simulated: bool

    @property
    def reported(self) -> int:
        """Accelerators the probe reported, usable or not."""
        return len(self.usable) + len(self.unusable)


def device_usable(device: Device, frameworks: Frameworks) -> tuple[Reason | None, str]:
    """``(None, "")`` if jobs may use ``device``, else the reason code and a human why."""
    if device.vendor in ("nvidia", "sim"):
        return None, ""
    if device.vendor == "amd":
        if frameworks.torch_hip and frameworks.cuda_available:
            return None, ""
        return Reason.UNSUPPORTED_VENDOR, "AMD GPU without a working torch ROCm"
    if device.vendor == "apple":
        if frameworks.mps_available:
            return None, ""
        return Reason.UNSUPPORTED_VENDOR, "Apple GPU without torch MPS"
    return Reason.NO_GPUS, "a CPU, not an accelerator"


def worker_support(caps: WorkerCapabilities) -> WorkerSupport:
    """Read ``caps`` against the support matrix."""
    usable: list[Device] = []
    unusable: list[Unusable] = []
    for device in caps.devices:
        if device.vendor == "cpu":
            continue  # a CPU entry is not an accelerator; never counted as one
        reason, why = device_usable(device, caps.frameworks)
        if reason is None:
            usable.append(device)
        else:
            unusable.append(Unusable(device, reason, why))
    vendors = {d.vendor for d in usable}
    runtime: Runtime = "cpu"
    backend: str | None = "gloo"
    if "sim" in vendors:
        runtime, backend = "sim", "gloo"
    elif "nvidia" in vendors:
        runtime, backend = "cuda", "nccl"
    elif "amd" in vendors:
        runtime, backend = "rocm", "nccl"
    elif "apple" in vendors:
        runtime, backend = "mps", None
    return WorkerSupport(
        usable=tuple(usable),
        unusable=tuple(unusable),
        runtime=runtime,
        dist_backend=backend,
        single_device_only=runtime == "mps",
        simulated=runtime == "sim",
    )


def job_refusal(support: WorkerSupport, gpus: int, nodes: int) -> tuple[Reason, str] | None:
    """The support-matrix rule a GPU job breaks on this worker, if any (ADR 0006)."""
    if support.single_device_only and (gpus > 1 or nodes > 1):
        return (
            Reason.MPS_DISTRIBUTED,
            "Apple MPS runs independent single-device jobs only; distributed MPS is not supported",
        )
    return None


def with_runtime(caps: WorkerCapabilities) -> WorkerCapabilities:
    """Fill ``runtime`` and ``dist_backend`` from the support matrix."""
    support = worker_support(caps)
    backend = support.dist_backend
    if backend == "nccl" and "nccl" not in caps.frameworks.distributed_backends:
        # Without a torch that has NCCL the GPUs still run commands; gangs fall back to gloo.
        backend = "gloo" if caps.frameworks.torch_version else None
    return caps.model_copy(
        update={
            "runtime": support.runtime,
            "dist_backend": backend,
            "simulated": caps.simulated or support.simulated,
        }
    )
