"""The worker registry: who is enrolled, who is alive, what each one is running, cordon and drain.

Workers live in memory and are written through to the store. Liveness is the contract's own rule
(``WorkerState.live``); a worker that has not heartbeated for ``heartbeat_timeout`` seconds of the
clock is ``overdue``, and the reaper declares it lost. What a lost worker means for its jobs is
decided elsewhere (``outcomes.py``); the registry only records the worker's state.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Job, JobState, WorkerInfo, WorkerRegistration, WorkerState
from ..errors import Conflict, InvalidInput, NotFound
from ..store import MetadataStore
from .events import EventLog
from .jobs import new_id

SETTABLE = (WorkerState.READY, WorkerState.CORDONED, WorkerState.DRAINING)


class WorkerRegistry:
    """Owns every known worker's record; ``jobs()`` lists active jobs, to count usage."""

    def __init__(
        self,
        store: MetadataStore,
        events: EventLog,
        jobs: Callable[[], Iterable[Job]],
        *,
        clock: Clock = SYSTEM_CLOCK,
        heartbeat_timeout: float = 30.0,
    ) -> None:
        self.store = store
        self.events = events
        self.jobs = jobs
        self.clock = clock
        self.heartbeat_timeout = heartbeat_timeout
        self._workers: dict[str, WorkerInfo] = {}

    # -- reading ---------------------------------------------------------------------------------

    def get(self, worker_id: str) -> WorkerInfo | None:
        return self._workers.get(worker_id)

    def all(self) -> builtins.list[WorkerInfo]:
        return sorted(self._workers.values(), key=lambda w: (w.name, w.id))

    def live(self) -> builtins.list[WorkerInfo]:
        """Workers that may be given work (in enrolment order: the scheduler breaks ties by it)."""
        return [w for w in self._workers.values() if w.live]

    def require(self, worker_id: str) -> WorkerInfo:
        """The worker, or NotFound if it never enrolled or was declared lost."""
        w = self._workers.get(worker_id)
        if w is None or w.state == WorkerState.LOST:
            raise NotFound(
                f"worker {worker_id} is not registered (or was declared lost)",
                hint="the worker must join again",
                code="worker_not_found",
            )
        return w

    def overdue(self, now: float) -> builtins.list[WorkerInfo]:
        """Live workers whose last heartbeat is older than ``heartbeat_timeout``."""
        return [
            w
            for w in self._workers.values()
            if w.live and now - w.last_heartbeat > self.heartbeat_timeout
        ]

    # -- changing --------------------------------------------------------------------------------

    def restore(self, saved: Iterable[WorkerInfo]) -> builtins.list[WorkerInfo]:
        """Take back the live workers the store knew (at start); returns the in-process ones.

        In-process workers died with their host process: the caller declares them lost. Remote
        workers get one heartbeat period from now to reconnect.
        """
        now = self.clock.now()
        dead = []
        for w in saved:
            if not w.live:
                continue
            if w.transport == "inprocess":
                self._workers[w.id] = w
                dead.append(w)
            else:
                self._workers[w.id] = w.model_copy(update={"last_heartbeat": now})
        return dead

    async def register(self, reg: WorkerRegistration, worker_id: str | None = None) -> WorkerInfo:
        """Enrol a worker (or re-enrol one after a restart, keeping its id and cordon/drain)."""
        now = self.clock.now()
        old = self._workers.get(worker_id) if worker_id else None
        kept = old is not None and old.state in (WorkerState.CORDONED, WorkerState.DRAINING)
        info = WorkerInfo(
            id=worker_id or new_id(),
            name=reg.name,
            labels=reg.labels,
            capabilities=reg.capabilities,
            address=reg.address,
            transport=reg.transport,
            registered_at=old.registered_at if old else now,
            last_heartbeat=now,
            state=old.state if old is not None and kept else WorkerState.READY,
        )
        return await self._commit(info)

    def heartbeat(self, worker_id: str) -> WorkerInfo:
        """The worker is alive now (in memory only: a heartbeat is not worth a write)."""
        w = self.require(worker_id).model_copy(update={"last_heartbeat": self.clock.now()})
        self._workers[worker_id] = w
        return w

    async def set_state(self, worker_id: str, state: WorkerState) -> WorkerInfo:
        """Cordon (no new work), drain (no new work; finishes what it has) or make ready."""
        if state not in SETTABLE:
            raise InvalidInput(f"a worker cannot be set to {state.value}")
        return await self._commit(self.require(worker_id).model_copy(update={"state": state}))

    def mark_gone(self, worker_id: str, state: WorkerState = WorkerState.LOST) -> WorkerInfo:
        """Take a worker out of service at once (lost or offline): no new work, no new calls."""
        if state.live:
            raise InvalidInput(f"{state.value} is not a way for a worker to go")
        w = self._workers[worker_id].model_copy(update={"state": state})
        self._workers[worker_id] = w
        return w

    async def save(self, worker_id: str) -> WorkerInfo:
        """Recount the worker's usage, write it and announce it."""
        return await self._commit(self._workers[worker_id])

    def refresh(self, worker_id: str) -> None:
        """Recount what the worker runs (a job on it started or ended) and announce it."""
        w = self._workers.get(worker_id)
        if w is not None:
            self._workers[worker_id] = w = self._with_usage(w)
            self.events.worker(w)

    async def remove(self, worker_id: str) -> bool:
        """Forget a worker that is gone (lost or offline), here and in the store; False if it was
        not known. A worker still in service must leave (or be declared lost) first."""
        w = self._workers.get(worker_id)
        if w is None:
            return False
        if w.live:
            raise Conflict(
                f"worker {w.name} is still in service",
                hint="it must leave (or be declared lost) before it is removed",
                code="worker_live",
            )
        del self._workers[worker_id]
        await self.store.delete_worker(worker_id)
        return True

    async def _commit(self, w: WorkerInfo) -> WorkerInfo:
        w = self._workers[w.id] = self._with_usage(w)
        await self.store.save_workers([w])
        self.events.worker(w)
        return w

    def _with_usage(self, w: WorkerInfo) -> WorkerInfo:
        running: builtins.list[str] = []
        device_jobs: dict[int, str] = {}
        for job in self.jobs():
            if job.placement is None or job.state not in (JobState.PLACED, JobState.RUNNING):
                continue
            for node in job.placement.nodes:
                if node.worker_id == w.id:
                    running.append(job.id)
                    for d in node.devices:
                        device_jobs[d] = job.id
        state = w.state
        if state in (WorkerState.READY, WorkerState.BUSY):
            state = WorkerState.BUSY if running else WorkerState.READY
        return w.model_copy(
            update={"running": sorted(running), "device_jobs": device_jobs, "state": state}
        )
