"""The pure, deterministic, explainable scheduler (ADR 0004): ``schedule(snapshot, cache) -> Plan``.

Stages (see README.md beside this file): ``feasible`` → ``rank`` → ``plan`` → ``reports`` →
``explain``; ``model`` holds the input and output values, ``cache`` what passes remember
(``SchedulerCache``), ``culprits`` finds the workers a failing pass fails on, ``testing`` builds
snapshots for tests.
"""

from __future__ import annotations

from .cache import SchedulerCache
from .explain import never_sentence, render, with_sessions
from .model import Assignment, JobRequest, Plan, Reservation, RunningJob, Snapshot, WorkerView
from .plan import gc_paused, schedule

__all__ = [
    "Assignment",
    "JobRequest",
    "Plan",
    "Reservation",
    "RunningJob",
    "SchedulerCache",
    "Snapshot",
    "WorkerView",
    "gc_paused",
    "never_sentence",
    "render",
    "schedule",
    "with_sessions",
]
