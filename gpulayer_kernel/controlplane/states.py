"""The job state machine: one transition table, the only place a job's state may change.

```
queued ──► placed ──► running ──► succeeded | failed | cancelled | lost
  │          │  └──► failed (could not launch) | cancelled | lost
  └──► cancelled      └──► queued (retry / requeue)       running ──► queued (retry)
```
"""

from __future__ import annotations

from ..contracts import JobState
from ..errors import Conflict

Q, P, R = JobState.QUEUED, JobState.PLACED, JobState.RUNNING
S, F, C, L = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    Q: frozenset({P, C}),
    P: frozenset({R, F, C, L, Q}),
    R: frozenset({S, F, C, L, Q}),
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
