"""The scheduler's input and output: plain frozen values, no I/O, no clock.

The ControlPlane builds a ``Snapshot`` (``now`` included), calls ``schedule(snapshot)``, and applies
the returned ``Plan`` in one transaction. The same snapshot always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..contracts import (
    ADMIN_USER,
    Placement,
    PlacementReport,
    Reason,
    Resources,
    WorkerCapabilities,
    WorkerState,
)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A queued job as the scheduler sees it."""

    id: str
    seq: int  # submission order; lower = earlier
    priority: int
    resources: Resources
    submitted_at: float
    timeout: float | None = None  # seconds; used for backfill around reservations
    owner: str = ADMIN_USER  # whose job: fair share and quotas (share.py)

    @property
    def is_gang(self) -> bool:
        """More than one rank: all devices at once or none; may reserve after waiting."""
        return self.resources.gpus > 1 or self.resources.nodes > 1


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding devices on a worker now."""

    id: str
    devices: tuple[int, ...]
    cpus: float = 0.0
    ends_by: float | None = None  # started_at + timeout, when the job has a timeout
    owner: str = ADMIN_USER  # whose job: its devices count against that user's quota


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker as the scheduler sees it. Build one per worker per pass; reuse the same
    ``capabilities`` object between passes (a ``SchedulerCache`` remembers what it derives)."""

    id: str
    name: str
    state: WorkerState
    labels: Mapping[str, str]
    capabilities: WorkerCapabilities
    running: tuple[RunningJob, ...] = ()
    # Why a worker in a state that takes work gets none now: ``Reason.WORKER_SUSPECT`` (its
    # connection closed) or ``Reason.UNSCHEDULABLE`` (its data broke a pass). None: no hold.
    hold: Reason | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """Devices a long-waiting gang job has claimed for when they free up."""

    job_id: str
    devices: Mapping[str, tuple[int, ...]]  # worker id -> device indices
    since: float
    starts_by: float | None = None  # when the reserved devices are expected free, if known


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    pending: tuple[JobRequest, ...]
    workers: tuple[WorkerView, ...]
    reservations: Mapping[str, Reservation] = field(default_factory=dict)
    reserve_after: float = 60.0  # seconds a gang job waits before it reserves devices
    # At most this many gang jobs hold reservations at once (Slurm's bf_max_job_test, in spirit):
    # each one blocks devices for every job behind it, so the queue degrades to FIFO past a few.
    max_reservations: int = 16
    # Fair share and quotas (share.py), computed by the control plane: recent use per user
    # (decayed GPU-seconds), GPU caps per "user:<name>" / "group:<name>", and each user's group.
    usage: Mapping[str, float] = field(default_factory=dict)
    gpu_quotas: Mapping[str, int] = field(default_factory=dict)
    groups: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A job placed by this pass: the ControlPlane moves it to ``placed`` with this placement."""

    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Plan:
    """What one pass decided: placements, a report per job left waiting, and the reservations to
    feed into the next snapshot (they replace the old ones)."""

    assignments: tuple[Assignment, ...]
    pending: Mapping[str, PlacementReport]
    reservations: Mapping[str, Reservation] = field(default_factory=dict)
