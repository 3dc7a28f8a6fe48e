"""The keyed write in progress (ADR 0003): what ``enqueue`` needs to know of an Idempotency-Key.

The API layer (``api/idempotency.py``) makes a ``Claim`` for a keyed request and hands it to the
handler, which passes it, as an argument, to the call that creates a job or a cell (``submit``,
``run``, ``submit_many``, ``start_session``, ``run_cell``: nothing reads it from a context):

- ``created(job)`` notes a new job on the key's record, queued in the store *before* the job's
  own row (same group commit, or an earlier one): a server killed after the job was stored
  always knows which request made it.
- ``take(spec)`` hands back a job an earlier try of the same request created (a retry after a
  restart, or a replay that follows the job, ``/jobs/run``), instead of creating another.
- ``made_cell`` / ``cell_of`` do the same for a session cell (noted as ``cell:SESSION:N``, queued
  before the cell's own row): a retried cell POST follows the cell its first try numbered.

Without a claim (the embedded ControlPlane, unkeyed requests) nothing changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..contracts import Job, JobSpec
from ..store import IdempotencyRecord, MetadataStore


@dataclass
class Claim:
    """One keyed request running now: its record as it grows, and the jobs it may reuse."""

    store: MetadataStore
    record: IdempotencyRecord
    bound: list[Job] = field(default_factory=list)  # jobs of an earlier try, not reused yet
    cells: list[tuple[str, int]] = field(default_factory=list)  # an earlier try's cells

    def cell_of(self, session_id: str) -> int | None:
        """The number of the cell an earlier try of this request posted in this session."""
        return next((n for sid, n in self.cells if sid == session_id), None)

    def made_cell(self, session_id: str, number: int) -> None:
        """Note a new cell on the record; call it before the cell's row is queued (no await)."""
        self.cells.append((session_id, number))
        self._note(f"{CELL_REF}{session_id}:{number}")

    def take(self, spec: JobSpec, owner: str) -> Job | None:
        """An earlier try's job for this spec (each is handed out once), or None."""
        for i, job in enumerate(self.bound):
            if job.spec == spec and job.owner == owner:
                return self.bound.pop(i)
        return None

    def created(self, job: Job) -> None:
        """Note ``job`` on the record; call it before the job's row is queued (no await)."""
        self._note(job.id)

    def _note(self, ref: str) -> None:
        self.record = dataclasses.replace(self.record, jobs=(*self.record.jobs, ref))
        self.store.queue_idempotency(self.record)


CELL_REF = "cell:"  # a record's note of a cell it made: ``cell:SESSION_ID:NUMBER``


def split_refs(refs: tuple[str, ...]) -> tuple[list[str], list[tuple[str, int]]]:
    """A record's notes as (job ids, (session id, cell number) pairs)."""
    jobs: list[str] = []
    cells: list[tuple[str, int]] = []
    for ref in refs:
        if ref.startswith(CELL_REF):
            sid, _, n = ref.removeprefix(CELL_REF).rpartition(":")
            cells.append((sid, int(n)))
        else:
            jobs.append(ref)
    return jobs, cells
