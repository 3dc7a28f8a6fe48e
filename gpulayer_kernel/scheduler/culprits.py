"""One bad worker must not stop the cluster: when a pass raises, find the workers whose data
makes it fail (the control plane's loop sets them aside, ``controlplane/scheduling.py``).

Pure, as the rest of this package: each worker is tried alone in a trial snapshot (first without
the queue, which is cheap, then with it), with a fresh cache, so nothing of the failed pass's
state is reused.
"""

from __future__ import annotations

from dataclasses import replace

from .cache import SchedulerCache
from .model import JobRequest, Snapshot, WorkerView
from .plan import schedule


def culprits(snapshot: Snapshot) -> list[tuple[WorkerView, str]]:
    """The workers on whose data a pass raises: each is tried alone (cheaply without the queue
    first), with a fresh cache. Empty when no single worker explains the failure (nor when
    every one does, and the pass fails without workers too: the queue is at fault then)."""

    def fails(workers: tuple[WorkerView, ...], pending: tuple[JobRequest, ...]) -> str | None:
        trial = replace(snapshot, workers=workers, pending=pending, reservations={})
        try:
            schedule(trial, SchedulerCache())
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__
        return None

    for pending in ((), snapshot.pending):
        found = []
        for w in snapshot.workers:
            why = fails((w,), pending)
            if why is not None:
                found.append((w, why))
        if found and len(found) == len(snapshot.workers) and fails((), pending) is not None:
            return []
        if found:
            return found
    return []
