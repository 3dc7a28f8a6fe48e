"""Worker-protocol and event contracts: what flows between the control plane and workers/UIs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

from ._base import Contract
from .artifacts import Artifact
from .jobs import Job, LogLine, NodePlacement
from .workers import WorkerInfo


class Rendezvous(Contract):
    """Where the ranks of a multi-node gang meet: published by the rank-0 worker."""

    master_addr: str
    master_port: int = Field(ge=1, le=65535)


class JobAssignment(Contract):
    """One job handed to one worker: the job, this worker's share, and resolved secrets."""

    job: Job
    node: NodePlacement
    nnodes: int = 1
    secrets: dict[str, str] = Field(
        default_factory=dict, description="resolved secret values; sent only to the worker"
    )


class Work(Contract):
    """The answer to a worker's long-poll: new jobs to start and jobs to stop."""

    assignments: list[JobAssignment] = Field(default_factory=list)
    cancel: list[str] = Field(default_factory=list)


class FinishReport(Contract):
    state: Literal["succeeded", "failed", "cancelled"]
    exit_code: int | None = None
    reason: str | None = None
    result: JsonValue = None
    artifacts: list[Artifact] = Field(default_factory=list)


class LogBatch(Contract):
    lines: list[LogLine] = Field(max_length=10_000)


class ProgressReport(Contract):
    fields: dict[str, JsonValue]


class Event(Contract):
    """A change a UI should show: a job or a worker, as it is now."""

    seq: int
    time: float
    kind: Literal["job", "worker"]
    job: Job | None = None
    worker: WorkerInfo | None = None


class EventPage(Contract):
    events: list[Event]
    next_since: int
    reset: bool = Field(
        False,
        description="events before the cursor were dropped, or the cursor is from before a "
        "restart: refetch the lists, then follow from `cursor`",
    )
    cursor: str = Field(
        "",
        description="where to follow on from: `<epoch>:<seq>`; the epoch changes with every "
        "control-plane start, so a cursor from before a restart is seen as such",
    )


class EventCursor(Contract):
    """The event log's current position: follow from here to see only what happens next."""

    cursor: str
