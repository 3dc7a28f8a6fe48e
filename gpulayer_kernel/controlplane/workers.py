"""The worker registry: who is enrolled, who is alive, what each one is running, cordon and drain.

Workers live in memory and are written through to the store. Liveness is the contract's own rule
(``WorkerState.live``); a worker that has not heartbeated for ``heartbeat_timeout`` seconds of the
clock is ``overdue``, and the reaper declares it lost. What a lost worker means for its jobs is
decided elsewhere (``outcomes.py``); the registry only records the worker's state.

Two marks keep new work off a worker that is still in service (``WorkerInfo.schedulable``):

- ``suspect``: its long-poll connection closed without an answer and it made no call within
  ``suspect_grace`` seconds (a killed process closes its sockets at once, long before its
  heartbeat is overdue). Any call from it clears the mark; the heartbeat timeout still decides
  when it is lost. Within the grace it already gets no new work (``suspected``): one that
  comes back loses milliseconds, one that died gets no gang placed on it.
- ``unschedulable``: its data made a scheduling pass fail (``set_aside``). Joining again (with new
  data) clears it; an admin can also remove the worker.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable, Iterable

from ..clock import SYSTEM_CLOCK, Clock, Timer
from ..contracts import Job, JobState, WorkerInfo, WorkerRegistration, WorkerState
from ..contracts.limits import HEARTBEAT_TIMEOUT
from ..errors import Conflict, InvalidInput, NotFound
from ..store import MetadataStore
from .events import EventLog
from .jobs import new_id

SETTABLE = (WorkerState.READY, WorkerState.CORDONED, WorkerState.DRAINING)
SUSPECT_GRACE = 3.0  # seconds a worker whose connection closed has to call again
# Heartbeats closer together than this leave the record as it is: liveness is judged in
# seconds (timeouts of several), and the worker's long-poll rounds touch it on every wake-up.
HEARTBEAT_RESOLUTION = 0.2
log = logging.getLogger("gpulayer.controlplane")


# What a worker runs: its placed and running jobs' ids (sorted), and device index -> job id.
_Usage = tuple[builtins.list[str], dict[int, str]]


class WorkerRegistry:
    """Owns every known worker's record; ``jobs()`` lists active jobs, to count usage."""

    def __init__(
        self,
        store: MetadataStore,
        events: EventLog,
        jobs: Callable[[], Iterable[Job]],
        *,
        clock: Clock = SYSTEM_CLOCK,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        suspect_grace: float = SUSPECT_GRACE,
        jobs_on: Callable[[str], Iterable[Job]] | None = None,
    ) -> None:
        """``jobs_on`` (a worker id -> its placed and running jobs, ``JobTable.on_worker``)
        spares a walk of every active job (``jobs``) each time a worker's usage is recounted."""
        self.store = store
        self.events = events
        self.jobs = jobs
        self.jobs_on = jobs_on
        self.clock = clock
        self.heartbeat_timeout = heartbeat_timeout
        self.suspect_grace = suspect_grace
        # Told when a worker becomes schedulable again or falls under suspicion (the control
        # plane runs a scheduling pass: placements and waiting jobs' reports change).
        self.on_change: Callable[[], None] = lambda: None
        self._workers: dict[str, WorkerInfo] = {}
        self._polls: dict[str, int] = {}  # worker id -> long-polls open now
        self._closed: dict[str, float] = {}  # worker id -> when its connection closed (monotonic)
        self._timers: dict[str, Timer] = {}  # worker id -> its suspicion grace timer
        self._tasks: set[asyncio.Task[WorkerInfo]] = set()
        # Worker id -> the jobs its usage was last counted from, and that count. The jobs it
        # holds change far less often than it is refreshed (a report of 64 ends refreshes it 64
        # times, a recount walks every job it holds: 0.48 ms with 512), so a recount is made
        # only when that list differs (compared by identity first: a job's change is a new copy).
        self._counted: dict[str, tuple[builtins.list[Job], _Usage]] = {}

    # -- reading ---------------------------------------------------------------------------------

    def get(self, worker_id: str) -> WorkerInfo | None:
        return self._workers.get(worker_id)

    def all(self) -> builtins.list[WorkerInfo]:
        return sorted(self._workers.values(), key=lambda w: (w.name, w.id))

    def live(self) -> builtins.list[WorkerInfo]:
        """Workers in service (in enrolment order: the scheduler breaks ties by it). Check
        ``schedulable`` before giving one new work."""
        return [w for w in self._workers.values() if w.live]

    def find(self, ref: str) -> WorkerInfo:
        """A worker by id, or by name when exactly one known worker (or one in service) has it."""
        w = self._workers.get(ref)
        if w is not None:
            return w
        named = [w for w in self._workers.values() if w.name == ref]
        if len(named) > 1:
            named = [w for w in named if w.live] or named
        if len(named) == 1:
            return named[0]
        if named:
            raise InvalidInput(
                f"{len(named)} workers are named {ref!r}",
                hint="give the worker's id (see `gpulayer workers --json`)",
                details={"worker": ref},
            )
        raise NotFound(
            f"no worker {ref!r}",
            hint="list workers with `gpulayer workers`",
            details={"worker": ref},
            code="worker_not_found",
        )

    def gone_named(self, name: str) -> bool:
        """A worker of this name is known but out of service (lost or offline): it may return."""
        return any(w.name == name and not w.live for w in self._workers.values())

    def trouble(self, worker_id: str) -> str | None:
        """Why the worker looks dead (lost, offline, suspect, or its connection just closed);
        None when nothing says so. Words for a job's reason: "worker w2 was lost (...)"."""
        w = self._workers.get(worker_id)
        if w is None:
            return "it was removed"
        if not w.live:
            return "it is " + w.state.value
        if w.suspect is not None:
            return w.suspect
        closed = self._closed.get(worker_id)
        if closed is not None and not self._polls.get(worker_id):
            ago = self.clock.monotonic() - closed
            return f"its connection closed {ago:.1f}s ago and it has not called since"
        return None

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
        """Enrol a worker (or re-enrol one after a restart, keeping its id and cordon/drain).

        A new id under the name of a worker that is gone (lost or offline) replaces that record:
        the same machine joining again is one row, not two. A worker in service keeps its record
        (a join never takes over a live worker). New data clears ``unschedulable``.
        """
        now = self.clock.now()
        old = self._workers.get(worker_id) if worker_id else None
        if old is None:
            for dead in [w for w in self._workers.values() if w.name == reg.name and not w.live]:
                await self._forget(dead.id)
        else:
            self._calm(old.id)
        kept = old is not None and old.state in (WorkerState.CORDONED, WorkerState.DRAINING)
        info = WorkerInfo(
            id=worker_id or new_id(),
            name=reg.name,
            labels=reg.labels,
            capabilities=reg.capabilities,
            address=reg.address,
            transport=reg.transport,
            shares=reg.shares,
            registered_at=old.registered_at if old else now,
            last_heartbeat=now,
            state=old.state if old is not None and kept else WorkerState.READY,
        )
        return await self._commit(info)

    def heartbeat(self, worker_id: str) -> WorkerInfo:
        """The worker is alive now (in memory only: a heartbeat is not worth a write, unless it
        clears a suspicion)."""
        w = self.require(worker_id)
        self._calm(worker_id)
        was_suspect = w.suspect is not None
        now = self.clock.now()
        if not was_suspect and 0 <= now - w.last_heartbeat < HEARTBEAT_RESOLUTION:
            return w  # seen within the resolution: no copy (each long-poll round touches it)
        w = w.model_copy(update={"last_heartbeat": now, "suspect": None})
        self._workers[worker_id] = w
        if was_suspect:
            log.info("worker %s called again: no longer suspect", w.name)
            self._save_soon(worker_id)
        return w

    def reported(self, worker_id: str) -> WorkerInfo:
        """A report from the worker: it is alive (its heartbeat timeout starts over), in memory
        only. Unlike a heartbeat or a poll it clears no mark: a stopping worker reports its jobs'
        ends after its long-poll closed, and must not be handed work again for it."""
        w = self.require(worker_id)
        now = self.clock.now()
        if 0 <= now - w.last_heartbeat < HEARTBEAT_RESOLUTION:
            return w
        w = self._workers[worker_id] = w.model_copy(update={"last_heartbeat": now})
        return w

    def dead_peer(self, worker_ids: Iterable[str], but: str) -> str | None:
        """Words naming the first of ``worker_ids`` (other than ``but``) that looks dead, for a
        gang's reason: "worker w2 was lost (its connection closed ...)"; None if none does."""
        for wid in worker_ids:
            why = self.trouble(wid) if wid != but else None
            if why is not None:
                w = self._workers.get(wid)
                return f"worker {w.name if w else wid} was lost ({why})"
        return None

    # -- suspicion: a closed connection ----------------------------------------------------------

    def suspected(self, worker_id: str) -> bool:
        """No new work for it now: it is suspect, or its connection closed and it has not
        called since (within the grace too: a worker that comes back loses milliseconds)."""
        w = self._workers.get(worker_id)
        if w is None:
            return False
        closed = worker_id in self._closed and not self._polls.get(worker_id)
        return w.suspect is not None or closed

    def polls(self, worker_id: str) -> int:
        """How many long-polls of the worker are open now."""
        return self._polls.get(worker_id, 0)

    def polling(self, worker_id: str, delta: int) -> None:
        """A long-poll of the worker opened (+1) or ended (-1)."""
        n = self._polls.get(worker_id, 0) + delta
        if n > 0:
            self._polls[worker_id] = n
        else:
            self._polls.pop(worker_id, None)

    def disconnected(self, worker_id: str) -> None:
        """The worker's long-poll connection closed before it was answered. Unless it calls
        again within ``suspect_grace`` seconds, it becomes ``suspect``: no new work."""
        w = self._workers.get(worker_id)
        if w is None or not w.live or self._polls.get(worker_id):
            return  # gone already, or another poll of it is open: it is back
        self._closed[worker_id] = self.clock.monotonic()
        timer = self._timers.pop(worker_id, None)
        if timer is not None:
            timer.cancel()
        self._timers[worker_id] = self.clock.call_later(
            self.suspect_grace, lambda: self._grace_over(worker_id)
        )
        self.on_change()

    def _grace_over(self, worker_id: str) -> None:
        self._timers.pop(worker_id, None)
        w = self._workers.get(worker_id)
        if (
            w is None
            or not w.live
            or w.suspect is not None
            or worker_id not in self._closed
            or self._polls.get(worker_id)
        ):
            return
        why = (
            f"its connection closed and it made no call for {self.suspect_grace:g}s; it is "
            f"declared lost after {self.heartbeat_timeout:g}s without a heartbeat"
        )
        log.warning("worker %s is suspect: %s", w.name, why)
        self._workers[worker_id] = w.model_copy(update={"suspect": why})
        self._save_soon(worker_id)

    def _save_soon(self, worker_id: str) -> None:
        """Write and announce the worker from a timer or a sync call; then rerun scheduling."""
        task = asyncio.get_running_loop().create_task(self.save(worker_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.on_change()

    # -- unschedulable: data that breaks a pass ---------------------------------------------------

    async def set_aside(self, worker_id: str, why: str) -> WorkerInfo:
        """Keep new work off a worker whose data made a scheduling pass fail, saying why."""
        w = self._workers[worker_id].model_copy(update={"unschedulable": why})
        self._workers[worker_id] = w
        return await self._commit(w)

    async def set_state(self, worker_id: str, state: WorkerState) -> WorkerInfo:
        """Cordon (no new work), drain (no new work; finishes what it has) or make ready."""
        if state not in SETTABLE:
            raise InvalidInput(f"a worker cannot be set to {state.value}")
        return await self._commit(self.require(worker_id).model_copy(update={"state": state}))

    def mark_gone(self, worker_id: str, state: WorkerState = WorkerState.LOST) -> WorkerInfo:
        """Take a worker out of service at once (lost or offline): no new work, no new calls."""
        if state.live:
            raise InvalidInput(f"{state.value} is not a way for a worker to go")
        w = self._workers[worker_id].model_copy(update={"state": state, "suspect": None})
        self._workers[worker_id] = w
        self._calm(worker_id)
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
        await self._forget(worker_id)
        return True

    async def _forget(self, worker_id: str) -> None:
        del self._workers[worker_id]
        self._counted.pop(worker_id, None)
        self._calm(worker_id)
        self._polls.pop(worker_id, None)
        await self.store.delete_worker(worker_id)

    def _calm(self, worker_id: str) -> None:
        """The worker called (or is gone): its closed connection no longer counts against it."""
        timer = self._timers.pop(worker_id, None)
        if timer is not None:
            timer.cancel()
        if self._closed.pop(worker_id, None) is not None:
            self.on_change()  # it may take work again

    async def _commit(self, w: WorkerInfo) -> WorkerInfo:
        w = self._workers[w.id] = self._with_usage(w)
        await self.store.save_workers([w])
        self.events.worker(w)
        return w

    def _with_usage(self, w: WorkerInfo) -> WorkerInfo:
        held = builtins.list(self.jobs() if self.jobs_on is None else self.jobs_on(w.id))
        counted = self._counted.get(w.id)
        if counted is not None and counted[0] == held:
            usage = counted[1]
        else:
            usage = _count(w.id, held)
            self._counted[w.id] = (held, usage)
        running, device_jobs = usage
        state = w.state
        if state in (WorkerState.READY, WorkerState.BUSY):
            state = WorkerState.BUSY if running else WorkerState.READY
        if w.running == running and w.device_jobs == device_jobs and w.state == state:
            return w  # nothing to copy: each refresh of a report's ends lands here
        # Copies: the count is kept, and a WorkerInfo once announced must not change.
        return w.model_copy(
            update={
                "running": builtins.list(running),
                "device_jobs": dict(device_jobs),
                "state": state,
            }
        )


def _count(worker_id: str, jobs: Iterable[Job]) -> _Usage:
    """What the worker runs: its placed and running jobs' ids (sorted), and device -> job."""
    running: builtins.list[str] = []
    device_jobs: dict[int, str] = {}
    for job in jobs:
        if job.placement is None or job.state not in (JobState.PLACED, JobState.RUNNING):
            continue
        for node in job.placement.nodes:
            if node.worker_id == worker_id:
                running.append(job.id)
                for d in node.devices:
                    device_jobs[d] = job.id
    running.sort()
    return running, device_jobs
