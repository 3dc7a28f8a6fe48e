"""Fair share and quotas: whose job goes first among equals, and who may hold how many GPUs.

**Fair share** orders the queue within each priority by *turns*: every user's oldest waiting job
has turn 0, the next turn 1, and so on; within a turn, users with less recent use go first
(``Snapshot.usage``: decayed GPU-seconds, computed by the control plane), then by name; within a
user, by submission. So no user waits behind more than one job of each other user per turn, and
of two users the one who used the GPUs less lately goes first. With one user it is plain
submission order, as before.

**Quotas** (``Snapshot.gpu_quotas``, by ``user:<name>`` and ``group:<name>``) cap the GPUs a
user's (or group's) placed and running jobs hold at once. A job that would pass its cap waits,
saying so ("alice is at her quota (4/4 GPUs)"), and does not mark its shape as unplaceable: the
next job of another user may still take those GPUs.

Pure: no I/O, no clock, ties on stable keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import attrgetter, lt

from .model import JobRequest, Snapshot


def gpus_of(job: JobRequest) -> int:
    return job.resources.gpus * job.resources.nodes


def fair_order(snapshot: Snapshot) -> list[JobRequest]:
    """The queue: priority high to low, then turn, recent use, user, submission, id."""
    pending = snapshot.pending
    seqs = [j.seq for j in pending]
    if all(map(lt, seqs, seqs[1:])):
        queue = list(pending)  # already in submission order, as the job table gives it
    else:
        queue = sorted(pending, key=attrgetter("seq", "id"))
    owners = {j.owner for j in queue}
    if len(owners) > 1:
        usage = snapshot.usage
        turn: Counter[tuple[int, str]] = Counter()
        keyed = []
        for job in queue:  # in submission order: each user's jobs take turns 0, 1, 2, ...
            k = (job.priority, job.owner)
            keyed.append((turn[k], usage.get(job.owner, 0.0), job.owner, job))
            turn[k] += 1
        keyed.sort(key=lambda t: t[:3])  # stable: submission order stays within ties
        queue = [t[3] for t in keyed]
    queue.sort(key=attrgetter("priority"), reverse=True)  # stable
    return queue


def fair_notes(queue: Sequence[JobRequest]) -> dict[str, str]:
    """For each job that fair share put behind later-submitted jobs of other users: how many.

    Within one user the queue keeps submission order, so every later-submitted job ahead of a
    job belongs to another user; counted per priority with a Fenwick tree (n log n).
    """
    if len({j.owner for j in queue}) < 2:
        return {}
    ranks = {seq: i + 1 for i, seq in enumerate(sorted({j.seq for j in queue}))}
    size = len(ranks)
    notes: dict[str, str] = {}
    tree = [0] * (size + 1)
    seen = 0
    first_turn: set[tuple[int, str]] = set()
    priority: int | None = None
    for job in queue:
        if job.priority != priority:
            priority, tree, seen = job.priority, [0] * (size + 1), 0
        r = ranks[job.seq]
        earlier, i = 0, r
        while i > 0:
            earlier += tree[i]
            i -= i & -i
        ahead = seen - earlier  # jobs ahead of it in the queue submitted after it
        key = (job.priority, job.owner)
        if ahead:
            jobs = "job" if ahead == 1 else "jobs"
            if key not in first_turn:
                notes[job.id] = f"behind {ahead} {jobs} of users with less recent use"
            else:
                notes[job.id] = (
                    f"behind {ahead} {jobs} of other users (fair share: one job per user per "
                    "turn, least recent use first)"
                )
        first_turn.add(key)
        seen += 1
        i = r
        while i <= size:
            tree[i] += 1
            i += i & -i
    return notes


class QuotaLedger:
    """GPUs held per quota subject during one pass: what runs, plus what this pass placed."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.quotas = snapshot.gpu_quotas
        self.groups = snapshot.groups
        self.held: Counter[str] = Counter()
        if not self.quotas:
            return
        for w in snapshot.workers:
            for r in w.running:
                for s in self.subjects(r.owner):
                    self.held[s] += len(r.devices)

    def subjects(self, owner: str) -> list[str]:
        group = self.groups.get(owner)
        return [f"user:{owner}", *([f"group:{group}"] if group else [])]

    def blocked(self, job: JobRequest) -> str | None:
        """Why ``job`` may not take GPUs now (its user or group at its cap), or None."""
        need = gpus_of(job)
        if not self.quotas or not need:
            return None
        for s in self.subjects(job.owner):
            cap = self.quotas.get(s)
            if cap is not None and self.held[s] + need > cap:
                kind, name = s.split(":", 1)
                who, whose = (name, "their") if kind == "user" else (f"group {name}", "its")
                if self.held[s] >= cap:
                    return f"{who} is at {whose} quota ({self.held[s]}/{cap} GPUs)"
                return (
                    f"{who} would pass {whose} quota ({self.held[s]}/{cap} GPUs, the job "
                    f"needs {need})"
                )
        return None

    def take(self, job: JobRequest) -> None:
        if self.quotas:
            for s in self.subjects(job.owner):
                self.held[s] += gpus_of(job)
