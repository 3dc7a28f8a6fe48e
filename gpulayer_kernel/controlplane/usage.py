"""Recent GPU use per user, for fair share: GPU-seconds that halve every ``half_life`` seconds.

A GPU held from ``s`` to ``e`` adds ``∫ 2^-(t_now - t)/h dt`` over [s, e], so an hour used a day
ago weighs half as much as an hour used now (one day is the default half-life). Finished jobs are
folded in when they end; jobs running now are added up to ``now`` at each snapshot. Nothing is
stored of its own: at start the meter is rebuilt from the jobs that ended recently (their
``started_at``, ``finished_at`` and GPUs), so a restart or a standby's takeover ranks users as
the old leader did.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..contracts import Job, JobState
from ..store import JobQuery, MetadataStore

DEFAULT_HALF_LIFE = 86_400.0
# How many ended jobs a start reads back: older ones weigh little after a few half-lives.
RELOAD_JOBS = 20_000
_ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST)


def gpus_held(job: Job) -> int:
    if job.placement is None:
        return 0
    return sum(len(n.devices) for n in job.placement.nodes)


class UsageMeter:
    """Decayed GPU-seconds per user: ``charge`` ended work, ``usage`` adds what runs now."""

    def __init__(self, half_life: float = DEFAULT_HALF_LIFE) -> None:
        self.half_life = half_life
        self._value: dict[str, float] = {}
        self._ref: dict[str, float] = {}  # the time each value is expressed at

    def _weight(self, age: float) -> float:
        return math.pow(2.0, -max(0.0, age) / self.half_life)

    def _area(self, start: float, end: float, at: float) -> float:
        """∫ over [start, end] of the decay weight seen from ``at`` (one GPU)."""
        if end <= start:
            return 0.0
        k = self.half_life / math.log(2.0)
        return k * (self._weight(at - end) - self._weight(at - start))

    def charge(self, owner: str, gpus: int, start: float, end: float) -> None:
        """Fold ``gpus`` held from ``start`` to ``end`` into ``owner``'s use."""
        if gpus <= 0 or end <= start:
            return
        ref = max(self._ref.get(owner, end), end)
        value = self._value.get(owner, 0.0) * self._weight(ref - self._ref.get(owner, ref))
        self._value[owner] = value + gpus * self._area(start, end, ref)
        self._ref[owner] = ref

    def charge_job(self, job: Job) -> None:
        if job.started_at is not None and job.finished_at is not None:
            self.charge(job.owner, gpus_held(job), job.started_at, job.finished_at)

    def usage(self, now: float, running: Iterable[Job] = ()) -> dict[str, float]:
        """Each user's decayed GPU-seconds at ``now``, running jobs included up to ``now``."""
        out = {u: v * self._weight(now - self._ref[u]) for u, v in self._value.items()}
        for job in running:
            start = job.started_at
            if start is not None:
                extra = gpus_held(job) * self._area(start, now, now)
                out[job.owner] = out.get(job.owner, 0.0) + extra
        return out

    async def load(self, store: MetadataStore) -> None:
        """Rebuild from the jobs that ended most recently (at start, or on a takeover)."""
        self._value.clear()
        self._ref.clear()
        for job in await store.list_jobs(JobQuery(states=_ENDED, limit=RELOAD_JOBS)):
            self.charge_job(job)
