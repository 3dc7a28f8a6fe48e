"""The pure, deterministic, explainable scheduler (ADR 0004): ``schedule(snapshot) -> Plan``.

Stages (see README.md beside this file): ``feasible`` → ``rank`` → ``plan`` → ``reports`` →
``explain``; ``model`` holds the input and output values, ``testing`` builds snapshots for tests.
"""

from __future__ import annotations

from .explain import render
from .model import Assignment, JobRequest, Plan, Reservation, RunningJob, Snapshot, WorkerView
from .plan import schedule

__all__ = [
    "Assignment",
    "JobRequest",
    "Plan",
    "Reservation",
    "RunningJob",
    "Snapshot",
    "WorkerView",
    "render",
    "schedule",
]
