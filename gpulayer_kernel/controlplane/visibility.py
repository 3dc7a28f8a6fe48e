"""What a user (not an admin or viewer) may read of shared things: workers, and the events
about them.

Everyone sees every worker (where work can go is no secret), but the ids of the jobs it runs are
their owners' business: a user reads its own jobs' ids, and another user's devices read as busy
(``HIDDEN_JOB``), with that job left out of ``running``. The same holds for the worker carried
by a worker event in ``GET /events``. Admins and viewers read everything (``sees_all``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..contracts import Event, Job, WorkerInfo
from ..contracts.workers import HIDDEN_JOB

Lookup = Callable[[str], Job | None]


def worker_seen_by(worker: WorkerInfo, user: str, job: Lookup) -> WorkerInfo:
    """``worker`` as ``user`` may read it: other users' job ids hidden. A job the control plane
    no longer holds in memory (``job`` answers None) is hidden too: unknown is not ``user``'s."""

    def mine(job_id: str) -> bool:
        found = job(job_id)
        return found is not None and found.owner == user

    if all(mine(j) for j in worker.running) and all(mine(j) for j in worker.device_jobs.values()):
        return worker  # the common case (nothing runs, or only its own): no copy
    return worker.model_copy(
        update={
            "running": [j for j in worker.running if mine(j)],
            "device_jobs": {d: j if mine(j) else HIDDEN_JOB for d, j in worker.device_jobs.items()},
        }
    )


def event_seen_by(event: Event, user: str, job: Lookup) -> Event:
    """A worker event with the worker as ``user`` may read it; any other event as it is (the
    caller keeps only the job and session events ``user`` owns)."""
    if event.worker is None:
        return event
    seen = worker_seen_by(event.worker, user, job)
    return event if seen is event.worker else event.model_copy(update={"worker": seen})
