"""Worker-protocol and event contracts: what flows between the control plane and workers/UIs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, JsonValue, model_validator

from ._base import Contract
from .artifacts import Artifact
from .jobs import Job, LogLine, NodePlacement
from .limits import MAX_LINES
from .sessions import CellAssignment, SessionInfo
from .workers import WorkerInfo

# Every report a worker sends about a job names the attempt it comes from; the control plane
# refuses one from an attempt that is no longer current (409 ``stale_attempt``) and tells that
# worker to stop it. Absent (a worker from before attempts had identities): the current attempt.
ATTEMPT_DESCRIPTION = (
    "the attempt this report comes from (its assignment's `attempt`); a report from an attempt "
    "that is no longer current is refused with 409 `stale_attempt`; absent: the current attempt"
)


def _attempt() -> Any:
    return Field(None, ge=0, le=1_000_000, description=ATTEMPT_DESCRIPTION)


class Rendezvous(Contract):
    """Where the ranks of a multi-node gang meet: published by the rank-0 worker."""

    master_addr: str
    master_port: int = Field(ge=1, le=65535)
    attempt: int | None = _attempt()


class JobAssignment(Contract):
    """One attempt of one job handed to one worker: the job, this worker's share, and secrets."""

    job: Job
    node: NodePlacement
    nnodes: int = 1
    secrets: dict[str, str] = Field(
        default_factory=dict, description="resolved secret values; sent only to the worker"
    )
    attempt: int = Field(
        0,
        ge=0,
        description="which attempt of the job this is (the job's `attempts` count when it was "
        "placed): the worker keys what it runs by (job id, attempt) and names it in every "
        "report; absent (an older control plane): the job's `attempts`",
    )

    @model_validator(mode="before")
    @classmethod
    def _attempt_of_the_job(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("attempt") is None:
            job = data.get("job")
            attempts = job.attempts if isinstance(job, Job) else (job or {}).get("attempts", 0)
            data = {**data, "attempt": attempts}
        return data


class AttemptRef(Contract):
    """One attempt of one job (a job's attempts share its id)."""

    job_id: str
    attempt: int = Field(ge=0)


class Work(Contract):
    """The answer to a worker's long-poll: new jobs to start and jobs to stop."""

    assignments: list[JobAssignment] = Field(default_factory=list)
    cancel: list[str] = Field(
        default_factory=list, description="jobs to stop, whichever attempt of them runs here"
    )
    stop: list[AttemptRef] = Field(
        default_factory=list,
        description="stale attempts to stop and drop: the job moved on (it was retried, or "
        "ended), so their reports are refused; a current attempt of the same job keeps running",
    )
    cells: list[CellAssignment] = Field(
        default_factory=list, description="session cells to run (ADR 0019), in order"
    )
    interrupts: list[str] = Field(
        default_factory=list,
        description="sessions whose running cell to interrupt (KeyboardInterrupt on every rank)",
    )
    restarts: list[str] = Field(
        default_factory=list,
        description="sessions whose processes to kill and start again (their state is lost)",
    )
    bundles: dict[str, str] = Field(
        default_factory=dict,
        description="protocol 1.1: small bundles of these assignments, base64 by sha256, so "
        "the worker need not fetch them (never sent to a worker that did not say 1.1)",
    )

    @property
    def empty(self) -> bool:
        return not (
            self.assignments
            or self.cancel
            or self.stop
            or self.cells
            or self.interrupts
            or self.restarts
        )


class FinishReport(Contract):
    state: Literal["succeeded", "failed", "cancelled"]
    exit_code: int | None = None
    reason: str | None = None
    result: JsonValue = None
    artifacts: list[Artifact] = Field(default_factory=list)
    attempt: int | None = _attempt()


class LogBatch(Contract):
    lines: list[LogLine] = Field(max_length=MAX_LINES)
    attempt: int | None = _attempt()


class ProgressReport(Contract):
    fields: dict[str, JsonValue]
    attempt: int | None = _attempt()


class Event(Contract):
    """A change a UI should show: a job or a worker, as it is now."""

    seq: int
    time: float
    kind: Literal["job", "worker", "session"]
    job: Job | None = None
    worker: WorkerInfo | None = None
    session: SessionInfo | None = None


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
