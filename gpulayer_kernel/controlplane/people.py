"""What disabling a user does to their work (issue 23, item 6; docs/teams.md).

A disabled user's tokens stop working at once (``UserService``). Their work then goes as
follows, each with the same reason, ``user alice was disabled by admin``:

- **sessions** are stopped: a session holds GPUs until stopped or idle, and nobody may run a
  cell in it any more, so keeping it would only keep others waiting;
- **queued jobs** are cancelled: they would start work nobody asked for any more;
- **placed and running jobs** are left to finish: they were admitted while the user was
  allowed, their results may matter, and they end on their own (their timeout, their budget).
  An admin cancels one that should not (``gpulayer cancel ID``).

Enabling the user again brings nothing back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from ..contracts import Job, JobState, SessionInfo
from ..errors import GPUlayerError


def disabled_reason(user: str, by: str) -> str:
    return f"user {user} was disabled by {by}"


async def end_work_of(
    user: str,
    by: str,
    *,
    sessions: Sequence[SessionInfo],
    jobs: Sequence[Job],
    stop_session: Callable[[str, str], Awaitable[object]],
    cancel: Callable[[Job, str], Awaitable[object]],
) -> tuple[list[str], list[str]]:
    """Stop ``user``'s live sessions and cancel their queued jobs; leave running ones be.
    Returns the ids of the sessions stopped and of the jobs cancelled.

    ``stop_session(job id, reason)`` and ``cancel(job, reason)`` are the control plane's own
    calls (as the embedded admin), so a stop here is the stop a user's own would be."""
    why = disabled_reason(user, by)
    stopped = []
    for s in sessions:
        if s.job.owner == user and not s.job.state.terminal:
            try:
                await stop_session(s.job.id, f"stopped: {why}")
            except GPUlayerError:
                continue  # it ended in the meantime: the user is disabled all the same
            stopped.append(s.job.id)
    cancelled = []
    for job in jobs:
        if job.owner == user and job.state == JobState.QUEUED and not job.spec.is_session:
            await cancel(job, f"cancelled: {why}")
            cancelled.append(job.id)
    return stopped, cancelled
