"""The job state machine: which moves a job may make, and which fields may change without one.

The job table (``jobs.py``) checks every change against these two tables before it commits it;
nothing else in the control plane changes a job.

```
queued ──► placed ──► running ──► succeeded | failed | cancelled | lost
  │          │  └──► failed (could not launch) | cancelled | lost
  │          └──► queued (retry / requeue)                running ──► queued (retry)
  └──► cancelled | failed (no worker here can ever run it, and it did not ask to wait)
```

A move may set any field (a placement, a finish time, an attempt count). Without a move, only the
fields in ``UPDATES`` may change: a waiting job's pending report; a placed or running job's cancel
request, progress, and the partial results of a gang's nodes. A final job never changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..contracts import JobState
from ..errors import Conflict

Q, P, R = JobState.QUEUED, JobState.PLACED, JobState.RUNNING
S, F, C, L = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    Q: frozenset({P, C, F}),
    P: frozenset({R, F, C, L, Q}),
    R: frozenset({S, F, C, L, Q}),
    S: frozenset(),
    F: frozenset(),
    C: frozenset(),
    L: frozenset(),
}

_ON_A_WORKER = frozenset({"cancel_requested", "reason", "progress", "artifacts", "result"})
UPDATES: dict[JobState, frozenset[str]] = {
    Q: frozenset({"pending"}),
    P: _ON_A_WORKER,
    R: _ON_A_WORKER,
    S: frozenset(),
    F: frozenset(),
    C: frozenset(),
    L: frozenset(),
}


def check_transition(job_id: str, current: JobState, target: JobState) -> None:
    """Refuse an illegal move with a Conflict that names both states."""
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "nothing (final)"
        raise Conflict(
            f"job {job_id} cannot go from {current.value} to {target.value}",
            hint=f"from {current.value} a job can go to: {allowed}",
            details={"job": job_id, "from": current.value, "to": target.value},
            code="illegal_transition",
        )


def check_update(job_id: str, current: JobState, fields: Iterable[str]) -> None:
    """Refuse a change of fields that a job in ``current`` may not make without a move."""
    bad = sorted(set(fields) - UPDATES[current])
    if bad:
        allowed = ", ".join(sorted(UPDATES[current])) or "nothing (final)"
        raise Conflict(
            f"job {job_id} cannot change {', '.join(bad)} while {current.value}",
            hint=f"while {current.value} a job can change: {allowed}",
            details={"job": job_id, "state": current.value, "fields": bad},
            code="illegal_update",
        )
