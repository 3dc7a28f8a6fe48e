"""Protocol 1.1 contracts (ADR 0003): fewer round trips for workers and for clients.

- A worker says everything it has about an attempt in one :class:`JobReport` (started, log lines,
  progress, its end), and about many attempts in one :class:`ReportBatch`: a short job is one
  request from its start to its result, a worker running many jobs sends their ends together.
- A client submits and follows a job in one :class:`RunRequest` (its bundle may ride inline),
  and follows it with :class:`JobFollow` pages (state, progress, result and log lines together);
  a sweep submits many specs in one :class:`SubmitBatch`.

Batches are checked entry by entry: an invalid or refused entry is answered by its index in a
:class:`Refusal` and the others go through. That is why a batch's items are plain JSON here and
each is validated on its own (as a :class:`JobReport` or a ``JobSpec``).
"""

from __future__ import annotations

from pydantic import Field, JsonValue

from ._base import Contract
from .jobs import Job, JobSpec, LogLine, LogRecord
from .limits import MAX_BATCH, MAX_LINES
from .protocol import FinishReport, _attempt

PROTOCOL = "1.1"
"""The protocol version this package speaks (``major.minor``; a peer of another major is
refused naming both, one of an older minor is spoken to as it understands)."""

MAX_INLINE_BUNDLE = 1 << 20  # bytes of a bundle carried inline (base64) in a run request


class JobReport(Contract):
    """What a worker says about one attempt of one job, in one go (applied in this order)."""

    job_id: str = Field(min_length=1, max_length=64)
    attempt: int | None = _attempt()
    started: bool = Field(False, description="its process started (placed → running)")
    lines: list[LogLine] = Field(default_factory=list, max_length=MAX_LINES)
    progress: dict[str, JsonValue] | None = None
    finished: FinishReport | None = Field(
        None,
        description="its end; with `started` in the same report, the start and the end are "
        "recorded together (one write of the job)",
    )


class ReportBatch(Contract):
    """Reports about several attempts; each entry is a :class:`JobReport`, checked on its own."""

    reports: list[JsonValue] = Field(max_length=MAX_BATCH)


class Refusal(Contract):
    """One entry of a batch that was not taken: which, and why (the error's own fields)."""

    index: int = Field(ge=0)
    job_id: str | None = None
    attempt: int | None = None
    code: str
    status: int
    message: str
    hint: str | None = None


class ReportAnswer(Contract):
    """The entries of a report batch that were refused (none: the answer is 204)."""

    refused: list[Refusal] = Field(default_factory=list)


class RunRequest(Contract):
    """Submit a job and follow it in the same request."""

    spec: JobSpec
    bundle: str | None = Field(
        None,
        max_length=(MAX_INLINE_BUNDLE * 4) // 3 + 4,
        description="the spec's bundle itself, base64, when the control plane may lack it (at "
        "most 1 MiB; larger ones are uploaded with PUT /bundles/{sha256} first)",
    )


class JobFollow(Contract):
    """A job as it is now and its log records after ``since``: one page of following it."""

    job: Job
    records: list[LogRecord]
    next_since: int = Field(description="pass as `since` for the next page")
    cursor: str = Field(
        description="pass as `cursor` for the next page: it answers when the job changes after "
        "this point (a restart of the control plane counts as a change)"
    )
    more: bool = Field(False, description="more records are waiting: ask again at once")


class SubmitBatch(Contract):
    """Several jobs in one request (a sweep); each entry is a JobSpec, checked on its own."""

    specs: list[JsonValue] = Field(max_length=MAX_BATCH)


class SubmitAnswer(Contract):
    """The jobs of a batch that were queued (in the order given) and the entries refused."""

    jobs: list[Job]
    refused: list[Refusal] = Field(default_factory=list)
