"""Worker contracts: what a worker is, what it can run, and how it enrols."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from ._base import Contract
from .workspace import WorkerShares

Vendor = Literal["nvidia", "amd", "apple", "sim", "cpu"]
Runtime = Literal["cuda", "rocm", "mps", "sim", "cpu"]


# Bounds on what a worker may claim (issue 12): the scheduler turns device indices into bit
# masks and sums memory, so one absurd registration (an index of 10**12) must be refused at the
# door, not discovered by every later scheduling pass. Each bound is far above real hardware.
MAX_DEVICE_INDEX = 1023
MAX_DEVICES = 256
MAX_MEMORY_BYTES = 1 << 60  # 1 EiB
MAX_CPUS = 1 << 16
MAX_TEXT = 256
MAX_LABELS = 64
MAX_LIST = 64

ShortText = Annotated[str, Field(max_length=MAX_TEXT)]


class Device(Contract):
    """One accelerator. ``vendor == "sim"`` is a simulated GPU whose maths runs on the CPU."""

    index: int = Field(ge=0, le=MAX_DEVICE_INDEX)
    vendor: Vendor
    name: str = Field(max_length=MAX_TEXT)
    kind: str = Field(
        max_length=MAX_TEXT, description='normalized kind, e.g. "h100", "a100", "l4", "m2", "sim"'
    )
    memory_bytes: int = Field(0, ge=0, le=MAX_MEMORY_BYTES)
    compute_capability: str | None = Field(None, max_length=MAX_TEXT)
    uuid: str | None = Field(None, max_length=MAX_TEXT)
    unified_memory: bool = Field(False, description="Apple silicon: memory shared with the CPU")

    @property
    def simulated(self) -> bool:
        return self.vendor == "sim"


class HostFacts(Contract):
    hostname: ShortText = ""
    os: ShortText = ""
    arch: ShortText = ""
    cpus: int = Field(1, ge=1, le=MAX_CPUS)
    memory_bytes: int = Field(0, ge=0, le=MAX_MEMORY_BYTES)
    python: ShortText = ""


class Frameworks(Contract):
    torch_version: ShortText | None = None
    torch_cuda: ShortText | None = Field(None, description="CUDA version torch was built with")
    cuda_available: bool = False
    mps_available: bool = False
    device_count: int = Field(0, ge=0, le=MAX_DEVICES)
    torch_hip: ShortText | None = Field(None, description="ROCm (HIP) version torch was built with")
    distributed_backends: list[ShortText] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description='torch.distributed backends found, e.g. ["gloo", "nccl"]',
    )


def _all_workloads() -> list[Literal["command", "python"]]:
    return ["command", "python"]


class WorkerCapabilities(Contract):
    """What a worker's probe found: host facts, devices, drivers and frameworks."""

    host: HostFacts = Field(default_factory=HostFacts)
    devices: list[Device] = Field(default_factory=list, max_length=MAX_DEVICES)
    cuda_driver: ShortText | None = None
    frameworks: Frameworks = Field(default_factory=Frameworks)
    workloads: list[Literal["command", "python"]] = Field(default_factory=_all_workloads)
    probe_errors: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="why a probe step found nothing (never a crash)",
    )
    simulated: bool = False
    runtime: Runtime = Field(
        "cpu",
        description="what GPU jobs run on here, from the support matrix (capabilities/support.py)",
    )
    dist_backend: Literal["nccl", "gloo"] | None = Field(
        None, description="torch.distributed backend a gang uses here; None: no gangs"
    )
    probe_sources: list[ShortText] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description='where the device facts came from: "torch", "nvml", "nvidia-smi", "simulated"',
    )

    @field_validator("devices")
    @classmethod
    def _unique_indices(cls, v: list[Device]) -> list[Device]:
        # Two devices with one index would let the scheduler hand one GPU to two jobs.
        seen: set[int] = set()
        for d in v:
            if d.index in seen:
                raise ValueError(f"device index {d.index} appears twice")
            seen.add(d.index)
        return v


class WorkerState(StrEnum):
    READY = "ready"
    BUSY = "busy"
    DRAINING = "draining"
    CORDONED = "cordoned"
    LOST = "lost"
    OFFLINE = "offline"

    @property
    def live(self) -> bool:
        """The one liveness rule: a lost or offline worker is gone; any other is present."""
        return self not in (WorkerState.LOST, WorkerState.OFFLINE)


# What a user (not an admin or viewer) reads in ``device_jobs`` for a device another user's job
# holds: the device is busy, and whose work it is is not theirs to know (issue 23, item 6).
HIDDEN_JOB = "hidden"


class WorkerInfo(Contract):
    id: str
    name: str
    state: WorkerState = WorkerState.READY
    labels: dict[str, str] = Field(default_factory=dict)
    capabilities: WorkerCapabilities = Field(default_factory=WorkerCapabilities)
    address: str | None = Field(None, description="advertised address for rendezvous")
    transport: Literal["inprocess", "http"] = "inprocess"
    shares: WorkerShares | None = Field(
        None,
        description="its host id and shared folders (ADR 0022); left out when none",
        exclude_if=lambda v: v is None,
    )
    registered_at: float
    last_heartbeat: float
    running: list[str] = Field(default_factory=list, description="ids of jobs it runs")
    device_jobs: dict[int, str] = Field(
        default_factory=dict, description="device index -> id of the job using it"
    )
    live: bool = Field(
        True,
        description="computed by the server from `state` (not lost, not offline); clients read "
        "it rather than repeat the rule",
    )
    unschedulable: str | None = Field(
        None,
        description="why the scheduler set this worker aside (its data made a scheduling pass "
        "fail); no new work goes to it until it joins again or an admin removes it",
    )
    suspect: str | None = Field(
        None,
        description="why this worker is under suspicion (its connection closed and it has not "
        "come back); no new work goes to it until it answers again or is declared lost",
    )

    @property
    def schedulable(self) -> bool:
        """In service and under no suspicion: the scheduler may give it new work."""
        return self.live and self.unschedulable is None and self.suspect is None

    @model_validator(mode="before")
    @classmethod
    def _compute_live(cls, data: Any) -> Any:
        # Derived, never trusted from input: one rule, written here, for every reader.
        if isinstance(data, dict):
            state = data.get("state", WorkerState.READY)
            data = {**data, "live": WorkerState(state).live}
        return data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        if update and "state" in update:
            object.__setattr__(copy, "live", WorkerState(copy.state).live)
        return copy


class WorkerRegistration(Contract):
    """What a worker sends when it joins."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    labels: dict[ShortText, ShortText] = Field(default_factory=dict, max_length=MAX_LABELS)
    capabilities: WorkerCapabilities = Field(default_factory=WorkerCapabilities)
    address: str | None = Field(None, max_length=MAX_TEXT)
    transport: Literal["inprocess", "http"] = "inprocess"
    shares: WorkerShares | None = Field(
        None,
        description="its host id and shared folders (ADR 0022); left out when none",
        exclude_if=lambda v: v is None,
    )
