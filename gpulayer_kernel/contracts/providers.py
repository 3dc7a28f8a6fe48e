"""Provider contracts (ADR 0010): offers a provider can launch, and the instances it launched.

An ``Offer`` is a capability template: what a worker started from it will advertise (GPU kind,
count and memory, CPUs, labels), plus what it costs per hour and how long it takes to boot. The
scheduler's own feasibility checks read it as they read a worker (``autoscale.fit``), so "this
would fit if provider X launched one" is decided by the same rules that place jobs.

An ``Instance`` is one machine GPUlayer asked a provider for. It is recorded before the provider
is called (so a control plane killed mid-launch never launches twice) and moves through
``InstanceState`` by the one table in ``controlplane/provisioning/instances.py``.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from ._base import Contract
from .workers import MAX_CPUS, MAX_MEMORY_BYTES, ShortText

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class Offer(Contract):
    """A machine a provider can launch, as the scheduler would see the worker on it."""

    provider: str = Field(pattern=NAME_PATTERN, description="the provider's name in the config")
    name: str = Field(pattern=NAME_PATTERN, description="the offer's name within its provider")
    region: ShortText = ""
    gpus: int = Field(0, ge=0, le=64)
    gpu_kind: ShortText = Field("", description='normalized kind, e.g. "a100"; "" with no GPUs')
    gpu_memory: int = Field(0, ge=0, le=MAX_MEMORY_BYTES, description="bytes per GPU")
    cpus: int = Field(1, ge=1, le=MAX_CPUS)
    memory_bytes: int = Field(0, ge=0, le=MAX_MEMORY_BYTES)
    labels: dict[ShortText, ShortText] = Field(default_factory=dict)
    price_per_hour: float = Field(
        ge=0, description="dollars per hour for the whole machine; 0 for owned hardware"
    )
    boot_seconds: float = Field(60.0, ge=0, description="typical seconds from launch to joined")
    max_hours: float | None = Field(
        None, gt=0, description="the longest an instance may live (a batch job's time limit)"
    )
    simulated: bool = Field(False, description="its worker advertises simulated GPUs")
    capacity: int | None = Field(
        None, ge=0, description="most instances of this offer at once (an SSH host: 1)"
    )

    @property
    def id(self) -> str:
        """``provider/name``: how sentences, the CLI and instances name the offer."""
        return f"{self.provider}/{self.name}"

    @property
    def unit_price(self) -> float:
        """Dollars per GPU-hour (per machine-hour for a machine without GPUs)."""
        return self.price_per_hour / self.gpus if self.gpus else self.price_per_hour


class InstanceState(StrEnum):
    REQUESTED = "requested"  # recorded; the provider may not have been called yet
    BOOTING = "booting"  # the provider accepted it; its worker has not joined
    JOINED = "joined"  # its worker joined with the instance's single-use token
    DRAINING = "draining"  # being scaled down: no new work, terminated once idle
    TERMINATED = "terminated"
    FAILED = "failed"
    PREEMPTED = "preempted"

    @property
    def ended(self) -> bool:
        return self in (InstanceState.TERMINATED, InstanceState.FAILED, InstanceState.PREEMPTED)


class Instance(Contract):
    """One machine GPUlayer asked a provider for, from request to end."""

    id: str = Field(pattern=r"^[0-9a-f]{12}$")
    provider: str
    offer: Offer = Field(description="the offer it was launched from, as it was then")
    state: InstanceState = InstanceState.REQUESTED
    worker_name: str = Field(description="the name its worker joins with")
    token_id: str | None = Field(
        None, description="its single-use instance token (never the secret)"
    )
    worker_id: str | None = None
    external_id: str | None = Field(
        None, description="the provider's own id: a Slurm job id, host:pid, a fake machine id"
    )
    requested_at: float
    boot_deadline: float = Field(description="terminated as failed if not joined by then")
    launched_at: float | None = None
    joined_at: float | None = None
    idle_since: float | None = Field(None, description="when its worker last ran nothing")
    ended_at: float | None = None
    reason: str | None = Field(None, description="why it failed, was preempted or terminated")
    for_jobs: list[str] = Field(default_factory=list, description="jobs it was launched for")
    charge_reported: float | None = Field(
        None, description="dollars the provider itself reports for it, where it reports any"
    )

    @property
    def hours(self) -> float:
        """Hours it has lived (or lived), from launch to end."""
        start = self.launched_at or self.requested_at
        end = self.ended_at if self.ended_at is not None else start
        return max(0.0, end - start) / 3600.0


class ProviderCheck(Contract):
    """What ``gpulayer providers`` says about one configured provider."""

    name: str
    kind: str
    ok: bool
    detail: str = Field("", description="what was checked, or why it failed")
    offers: list[Offer] = Field(default_factory=list)
    instances: int = Field(0, description="instances of it that are not ended")
    max_instances: int = 0
    backoff_until: float | None = Field(None, description="no launch before this (failures)")
    last_error: str | None = None


class ProviderList(Contract):
    providers: list[ProviderCheck]
    autoscaling: bool = Field(description="whether this control plane runs the autoscaler")
    config: str = Field("", description="the provider config file read")


class InstanceList(Contract):
    instances: list[Instance]
