"""Placement explanations: why a job waits, or why it went where it went."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from ._base import Contract


class Reason(StrEnum):
    """Stable reason codes. ``filtered`` ones never clear by waiting; ``exhausted`` ones may."""

    # filtered: this worker can never run the job
    WORKER_NOT_READY = "worker_not_ready"
    CORDONED = "cordoned"
    SELECTOR_MISMATCH = "selector_mismatch"
    NAME_MISMATCH = "name_mismatch"
    NO_GPUS = "no_gpus"
    GPU_KIND = "gpu_kind"
    GPU_MEMORY = "gpu_memory"
    TOO_FEW_GPUS_TOTAL = "too_few_gpus_total"
    MPS_DISTRIBUTED = "mps_distributed"
    UNSUPPORTED_VENDOR = "unsupported_vendor"
    CPUS_TOTAL = "cpus_total"
    DRAINING = "draining"
    TOO_FEW_NODES = "too_few_nodes"
    UNSCHEDULABLE = "unschedulable"
    # exhausted: this worker could run the job, just not now
    GPUS_BUSY = "gpus_busy"
    RESERVED = "reserved"
    CPUS_BUSY = "cpus_busy"
    NOT_ENOUGH_NODES = "not_enough_nodes"
    WORKER_SUSPECT = "worker_suspect"

    @property
    def waiting_helps(self) -> bool:
        """True for ``exhausted`` codes (could run, not now); False for ``filtered`` ones."""
        return self in _EXHAUSTED


_EXHAUSTED = frozenset(
    {
        Reason.GPUS_BUSY,
        Reason.RESERVED,
        Reason.CPUS_BUSY,
        Reason.NOT_ENOUGH_NODES,
        # It answers again within moments, or is declared lost: either way the wait ends.
        Reason.WORKER_SUSPECT,
    }
)


class ScalingCode(StrEnum):
    """What the autoscaler can do for a waiting job (``PlacementReport.scaling``)."""

    LAUNCHING = "launching"  # an instance is being launched for it
    BOOTING = "booting"  # an instance launched earlier will take it once its worker joins
    OVER_BUDGET = "over_budget"  # an offer fits, but its estimate is more than a budget has left
    MAX_PRICE = "max_price"  # an offer fits, but it would pass the configured max $/h
    PROVIDER_LIMIT = "provider_limit"  # an offer fits, but its provider is at max_instances
    PROVIDER_BACKOFF = "provider_backoff"  # an offer fits; its provider's launches failed lately
    PROVIDER_ERROR = "provider_error"  # the provider of the offer that fits cannot be reached
    NO_OFFER = "no_offer"  # no provider offers a machine that could run it


class ScalingNote(Contract):
    """The autoscaler's word on a waiting job: what it launches for it, or why it cannot."""

    code: ScalingCode
    offer: str | None = Field(None, description="the cheapest offer that fits (provider/name)")
    price_per_hour: float | None = Field(None, description="dollars per hour, every machine")
    boot_seconds: float | None = None
    machines: int = Field(1, ge=1, description="machines it needs (a multi-node gang: more)")
    instances: list[str] = Field(default_factory=list, description="launching/booting for it")
    estimate: float | None = Field(None, description="dollars it would cost on that offer")
    budget: str | None = None
    budget_left: float | None = None
    limit: float | None = Field(None, description="max $/h or max instances in the way")
    retry_in: float | None = Field(
        None, description="provider backoff: seconds (from the note) until it launches again"
    )
    detail: str = Field("", description="e.g. the provider's last error")


class ReasonCount(Contract):
    code: Reason
    workers: int = Field(ge=0)
    detail: str
    waiting_helps: bool


class SessionHold(Contract):
    """GPUs a session holds on a worker the waiting job could use (ADR 0019)."""

    session_id: str
    name: str
    holder: str = Field(description="who holds it, as sentences name it (its notebook)")
    worker: str
    gpus: int = Field(ge=0)
    idle_since: float | None = Field(None, description="None while a cell runs")


class PlacementReport(Contract):
    """One report per placement attempt (nomad's AllocMetric, Kubernetes' FitError)."""

    job_id: str
    workers_total: int = 0
    workers_feasible: int = 0
    filtered: list[ReasonCount] = Field(default_factory=list)
    exhausted: list[ReasonCount] = Field(default_factory=list)
    reserved_by: str | None = Field(
        None, description="the job whose reservation holds devices this one could otherwise use"
    )
    reservation: list[str] = Field(
        default_factory=list, description="worker ids this waiting gang job has reserved"
    )
    position: int | None = Field(None, description="place in the queue, 1 = next")
    sentence: str = ""
    nodes: int = Field(1, ge=1, description="workers the job needs at once (multi-node gang)")
    candidates: list[str] = Field(
        default_factory=list,
        description="up to 3 workers (names) that could run it once capacity frees, best first",
    )
    largest_gpus: int | None = Field(
        None,
        description="GPU jobs: the most GPUs of an acceptable kind and memory on any one worker "
        "(whatever its state): what exists, for a job that can never fit",
    )
    largest_cpus: int | None = Field(
        None, description="jobs asking for CPUs: the most CPUs on any one worker"
    )
    sessions: list[SessionHold] = Field(
        default_factory=list,
        description="sessions holding GPUs on the workers that could run it once they free up",
    )
    quota: str | None = Field(
        None, description="why its user's or group's GPU quota holds it back now (waiting helps)"
    )
    fair_share: str | None = Field(
        None, description="how many later jobs of other users fair share put ahead of it"
    )
    scaling: ScalingNote | None = Field(
        None, description="what the autoscaler launches for it, or why it cannot (providers)"
    )

    @property
    def never_fits(self) -> bool:
        """Workers exist, and each can never run the job for what it *is* (its devices, CPUs,
        labels or name), none only for its state (cordoned, draining, suspect, set aside), and
        none is merely busy: waiting for capacity alone will not place it."""
        state_codes = (
            Reason.WORKER_NOT_READY,
            Reason.CORDONED,
            Reason.DRAINING,
            Reason.UNSCHEDULABLE,
        )
        launchable = self.scaling is not None and self.scaling.code != ScalingCode.NO_OFFER
        return (
            self.workers_total > 0
            and not self.exhausted
            and self.workers_feasible == 0
            and not any(rc.code in state_codes for rc in self.filtered)
            and not launchable  # an offer fits it: a provider can start a worker that can
        )

    @property
    def waiting_helps(self) -> bool:
        launch = self.scaling is not None and self.scaling.code in (
            ScalingCode.LAUNCHING,
            ScalingCode.BOOTING,
            ScalingCode.PROVIDER_BACKOFF,
        )
        return bool(self.exhausted) or self.workers_total == 0 or self.quota is not None or launch
