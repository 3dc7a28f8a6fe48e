"""Worker contracts: what a worker is, what it can run, and how it enrols."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from ._base import Contract

Vendor = Literal["nvidia", "amd", "apple", "sim", "cpu"]
Runtime = Literal["cuda", "rocm", "mps", "sim", "cpu"]


class Device(Contract):
    """One accelerator. ``vendor == "sim"`` is a simulated GPU whose maths runs on the CPU."""

    index: int = Field(ge=0)
    vendor: Vendor
    name: str
    kind: str = Field(description='normalized kind, e.g. "h100", "a100", "l4", "m2", "sim"')
    memory_bytes: int = Field(0, ge=0)
    compute_capability: str | None = None
    uuid: str | None = None
    unified_memory: bool = Field(False, description="Apple silicon: memory shared with the CPU")

    @property
    def simulated(self) -> bool:
        return self.vendor == "sim"


class HostFacts(Contract):
    hostname: str = ""
    os: str = ""
    arch: str = ""
    cpus: int = Field(1, ge=1)
    memory_bytes: int = Field(0, ge=0)
    python: str = ""


class Frameworks(Contract):
    torch_version: str | None = None
    torch_cuda: str | None = Field(None, description="CUDA version torch was built with")
    cuda_available: bool = False
    mps_available: bool = False
    device_count: int = 0
    torch_hip: str | None = Field(None, description="ROCm (HIP) version torch was built with")
    distributed_backends: list[str] = Field(
        default_factory=list, description='torch.distributed backends found, e.g. ["gloo", "nccl"]'
    )


def _all_workloads() -> list[Literal["command", "python"]]:
    return ["command", "python"]


class WorkerCapabilities(Contract):
    """What a worker's probe found: host facts, devices, drivers and frameworks."""

    host: HostFacts = Field(default_factory=HostFacts)
    devices: list[Device] = Field(default_factory=list)
    cuda_driver: str | None = None
    frameworks: Frameworks = Field(default_factory=Frameworks)
    workloads: list[Literal["command", "python"]] = Field(default_factory=_all_workloads)
    probe_errors: list[str] = Field(
        default_factory=list, description="why a probe step found nothing (never a crash)"
    )
    simulated: bool = False
    runtime: Runtime = Field(
        "cpu",
        description="what GPU jobs run on here, from the support matrix (capabilities/support.py)",
    )
    dist_backend: Literal["nccl", "gloo"] | None = Field(
        None, description="torch.distributed backend a gang uses here; None: no gangs"
    )
    probe_sources: list[str] = Field(
        default_factory=list,
        description='where the device facts came from: "torch", "nvml", "nvidia-smi", "simulated"',
    )


class WorkerState(StrEnum):
    READY = "ready"
    BUSY = "busy"
    DRAINING = "draining"
    CORDONED = "cordoned"
    LOST = "lost"
    OFFLINE = "offline"


class WorkerInfo(Contract):
    id: str
    name: str
    state: WorkerState = WorkerState.READY
    labels: dict[str, str] = Field(default_factory=dict)
    capabilities: WorkerCapabilities = Field(default_factory=WorkerCapabilities)
    address: str | None = Field(None, description="advertised address for rendezvous")
    transport: Literal["inprocess", "http"] = "inprocess"
    registered_at: float
    last_heartbeat: float
    running: list[str] = Field(default_factory=list, description="ids of jobs it runs")
    device_jobs: dict[int, str] = Field(
        default_factory=dict, description="device index -> id of the job using it"
    )


class WorkerRegistration(Contract):
    """What a worker sends when it joins."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    labels: dict[str, str] = Field(default_factory=dict)
    capabilities: WorkerCapabilities = Field(default_factory=WorkerCapabilities)
    address: str | None = None
    transport: Literal["inprocess", "http"] = "inprocess"
