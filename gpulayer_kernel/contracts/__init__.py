"""Versioned wire contracts (ADR 0002): pydantic v2 models, strict, JSON only."""

from __future__ import annotations

from ._base import API_VERSION, Contract, ensure_json, parse
from .artifacts import Artifact
from .jobs import (
    TERMINAL_STATES,
    CommandWorkload,
    Job,
    JobList,
    JobSpec,
    JobState,
    LogLine,
    LogPage,
    LogRecord,
    NodePlacement,
    Placement,
    PythonWorkload,
    Resources,
    Workload,
)
from .parsing import check_secret_name, parse_pairs
from .protocol import (
    AttemptRef,
    Event,
    EventCursor,
    EventPage,
    FinishReport,
    JobAssignment,
    LogBatch,
    ProgressReport,
    Rendezvous,
    Work,
)
from .scheduling import PlacementReport, Reason, ReasonCount
from .workers import (
    Device,
    Frameworks,
    HostFacts,
    WorkerCapabilities,
    WorkerInfo,
    WorkerRegistration,
    WorkerState,
)

__all__ = [
    "API_VERSION",
    "TERMINAL_STATES",
    "Artifact",
    "AttemptRef",
    "CommandWorkload",
    "Contract",
    "Device",
    "Event",
    "EventCursor",
    "EventPage",
    "FinishReport",
    "Frameworks",
    "HostFacts",
    "Job",
    "JobAssignment",
    "JobList",
    "JobSpec",
    "JobState",
    "LogBatch",
    "LogLine",
    "LogPage",
    "LogRecord",
    "NodePlacement",
    "Placement",
    "PlacementReport",
    "ProgressReport",
    "PythonWorkload",
    "Reason",
    "ReasonCount",
    "Rendezvous",
    "Resources",
    "Work",
    "WorkerCapabilities",
    "WorkerInfo",
    "WorkerRegistration",
    "WorkerState",
    "Workload",
    "check_secret_name",
    "ensure_json",
    "parse",
    "parse_pairs",
]
