"""The autoscaler's input and output: plain frozen values, no I/O, no clock, no randomness.

The control plane builds a ``ScalingSnapshot`` (``now`` included) after each scheduling pass and
on each reconciler round, calls ``plan_scaling(snapshot, offers, budgets)`` and carries the plan
out. The same inputs always give the same plan: a recorded snapshot replays exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..contracts import InstanceState, Offer, Resources, ScalingNote


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job the scheduler could not place now, as the autoscaler sees it."""

    id: str
    seq: int
    priority: int
    resources: Resources
    submitted_at: float
    hours: float  # what its estimate assumes: its timeout, else the typical run time
    budgets: tuple[str, ...] = ()  # the budgets it spends from (matched on its labels)


@dataclass(frozen=True, slots=True)
class ProviderView:
    name: str
    max_instances: int
    backoff_until: float | None = None  # no launch before this (recent failures)
    failures: int = 0  # consecutive failed launches or boots
    last_error: str | None = None
    down: str | None = None  # why its offers could not be read now (its offers are stale)


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    provider: str
    offer: Offer
    state: InstanceState
    requested_at: float
    boot_deadline: float
    joined_at: float | None = None
    idle_since: float | None = None  # its worker runs nothing since then (None: busy)


@dataclass(frozen=True, slots=True)
class ScalingSnapshot:
    now: float
    pending: tuple[PendingJob, ...]
    providers: Mapping[str, ProviderView]
    instances: tuple[InstanceView, ...] = ()
    max_price_per_hour: float | None = None
    idle_timeout: float = 300.0
    scale_up_after: float = 0.0  # seconds a job waits before a machine is launched for it


@dataclass(frozen=True, slots=True)
class Launch:
    """Start one machine from ``offer``; ``jobs`` are those it was planned for (first: the one
    that asked for it). A gang of N nodes gets N launches of one offer."""

    offer: Offer
    jobs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Terminate:
    instance_id: str
    why: str


@dataclass(frozen=True, slots=True)
class ScalingPlan:
    launches: tuple[Launch, ...] = ()
    terminations: tuple[Terminate, ...] = ()
    notes: Mapping[str, ScalingNote] = field(default_factory=dict)  # per waiting job
