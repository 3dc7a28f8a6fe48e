"""The ControlPlane's parts, built and connected (ADR 0001): the one place that knows which part
calls which. ``Wiring`` is the base of ``ControlPlane`` (``core.py``): its constructor builds every
part over the store, its callbacks are what one part's change does to the others (a job changed,
a worker lost, the reaper's round), and ``start``/``close`` bring them up and down in order. The
calls users, workers and admins make are services over these parts (the ``*_side.py`` modules),
each given only the parts it uses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import JobState, WorkerState
from ..contracts.limits import HEARTBEAT_TIMEOUT
from ..errors import GPUlayerError
from ..redact import Redactor
from ..security.users import UserService
from ..security.vault import MEMORY_KEYS, KeySource
from ..store import ArtifactStore, MetadataStore
from ..workspace.service import WorkspacePlane
from .admin_side import AdminCalls
from .audit import AuditLog
from .blobs import Blobs
from .client_side import BlobCalls, JobCalls, ViewCalls
from .dispatch import Dispatcher
from .events import EventLog
from .follow import Follower
from .inline import InlineBundles
from .jobs import Change, JobTable
from .logs import LogTails
from .metrics import Metrics
from .outcomes import Outcomes
from .provisioning.part import Provisioning
from .reaper import Reaper
from .reports import Reports
from .scheduling import SchedulingLoop
from .secrets import SecretTable
from .sessions.kernels import KernelRelay
from .sessions.side import SessionCalls
from .sessions.table import SessionTable
from .usage import DEFAULT_HALF_LIFE, UsageMeter
from .worker_side import WorkerCalls
from .workers import SUSPECT_GRACE, WorkerRegistry

log = logging.getLogger("gpulayer.controlplane")
LAST_TRY = 5.0  # seconds a closing control plane gives the writes an outage kept


class Wiring:
    """Every part of a control plane, and what connects them (a base of ``ControlPlane``)."""

    def __init__(
        self,
        store: MetadataStore,
        artifacts: ArtifactStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        reserve_after: float = 60.0,
        rendezvous_timeout: float = 120.0,
        suspect_grace: float = SUSPECT_GRACE,
        secrets_key: KeySource = MEMORY_KEYS,
        fair_share_half_life: float = DEFAULT_HALF_LIFE,
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        self.clock = clock
        self.redactor = Redactor()
        self.users = UserService(store, clock=clock.now)
        self.secrets = SecretTable(store, self.redactor, secrets_key)
        self.usage = UsageMeter(fair_share_half_life)
        self.blobs = Blobs(store, artifacts)
        self.event_log = EventLog(clock)
        self.jobs = JobTable(
            store,
            self.event_log,
            clock=clock,
            on_change=self._job_changed,
            redact=self.redactor.redact_json,
        )
        active, hb = self.jobs.active, heartbeat_timeout
        self.registry = WorkerRegistry(
            store,
            self.event_log,
            active,
            clock=clock,
            heartbeat_timeout=hb,
            suspect_grace=suspect_grace,
            jobs_on=self.jobs.on_worker,
        )
        self.tails = LogTails(
            store, self.redactor, wake=self.jobs.wake, changed=self.jobs.changed, clock=clock
        )
        self.dispatch = Dispatcher(clock, self.jobs.active_job)
        parts = (self.jobs, self.registry, self.tails, self.dispatch)
        self.outcomes = Outcomes(*parts, clock=clock, rendezvous_timeout=rendezvous_timeout)
        self.reports = Reports(
            self.jobs, self.tails, self.dispatch, self.outcomes, made_by=self.blobs.made_by
        )
        self.follower = Follower(self.jobs, self.tails, self.event_log, clock=clock)
        self.inline = InlineBundles(artifacts)
        self.scheduling = SchedulingLoop(
            store,
            *parts,
            clock=clock,
            reserve_after=reserve_after,
            secrets=self.secrets,
            users=self.users,
            usage=self.usage,
        )
        self.provisioning = Provisioning(
            store,
            self.jobs,
            self.registry,
            self.tails,
            self.scheduling,
            lose=lambda wid, why, preempted: self._lose_worker(wid, why, preempted=preempted),
            cancel=self.outcomes.cancel,
            clock=clock,
        )
        self.reaper = Reaper(self.registry, self._lose_worker, self._overdue, clock=clock)
        self.sessions = SessionTable(
            store, self.jobs, self.dispatch, self.tails, self.event_log, self.redactor, clock=clock
        )
        self.kernels = KernelRelay(self.jobs, self.dispatch, self.sessions, clock=clock)
        self.workspace = WorkspacePlane(
            self.jobs, self.sessions, self.registry, artifacts, store
        )  # ADR 0022
        self.registry.on_change = self.scheduling.kick  # a worker under suspicion, or back
        self.audit = AuditLog(store, clock=clock)  # who did what (ADR 0020)
        self.metrics = Metrics(self)  # its own registry: several control planes share a process
        self.metrics.instrument(self.scheduling, store, self.provisioning.ledger)

        # The services over the parts, each given only the parts it uses (ADR 0001).
        self.blob_calls = BlobCalls(self.blobs, self.inline)
        self.job_calls = JobCalls(
            store=self.store,
            users=self.users,
            blobs=self.blobs,
            jobs=self.jobs,
            tails=self.tails,
            outcomes=self.outcomes,
            follower=self.follower,
            scheduling=self.scheduling,
            provisioning=self.provisioning,
            audit=self.audit,
            upload=self.blob_calls.upload,
        )
        self.view_calls = ViewCalls(self.registry, self.jobs, self.event_log)
        self.worker_calls = WorkerCalls(
            clock=self.clock,
            store=self.store,
            dispatch=self.dispatch,
            inline=self.inline,
            jobs=self.jobs,
            tails=self.tails,
            outcomes=self.outcomes,
            provisioning=self.provisioning,
            reports=self.reports,
            scheduling=self.scheduling,
            sessions=self.sessions,
            registry=self.registry,
            lose=self._lose_worker,
        )
        self.session_calls = SessionCalls(self.sessions, self.blobs, self.audit, self.jobs)
        self.admin_calls = AdminCalls(
            secrets=self.secrets,
            users=self.users,
            audit=self.audit,
            jobs=self.jobs,
            outcomes=self.outcomes,
            provisioning=self.provisioning,
            sessions=self.sessions,
            stop_session=self.session_calls.stop_session,
        )
        # The links between parts that go through a service's rule.
        self.sessions.submit, self.sessions.cancel = self.job_calls.enqueue, self.job_calls.cancel
        self.scheduling.session_holds = self.session_calls.session_holds

    async def start(self) -> None:
        """Load active jobs and known workers; workers of a dead in-process host are lost."""
        await self.secrets.start()  # first: a missing or wrong key refuses the start untouched
        await self.users.load()
        await self.users.ensure_admin()
        await self.jobs.load()
        await self.audit.load()
        await self.sessions.load()
        await self.usage.load(self.store)
        await self.provisioning.start()
        for w in self.registry.restore(await self.store.load_workers()):
            await self._lose_worker(w.id, "its host process stopped")
        await self.outcomes.orphans_at_start()  # after the losses: their jobs are settled
        await self.outcomes.redeliver_placed(self.secrets.for_job)
        self.event_log.open = self.dispatch.open = True
        self.reaper.start()
        self.scheduling.start()

    async def close(self) -> None:
        await self._last_writes()
        self.scheduling.close()
        self.sessions.close()
        await self.provisioning.close()
        await self.reaper.stop()
        self.jobs.close()
        self.tails.close()
        self.dispatch.close()
        self.event_log.close()

    async def _last_writes(self) -> None:
        """What a store outage kept (job changes, log lines; ADR 0008) gets one last try when
        the control plane closes, then a warning names what is lost, instead of nothing."""
        await _last_try("job changes", lambda: len(self.jobs.dirty), self.jobs.resync)
        await _last_try("log lines", lambda: self.tails.unsaved, self.tails.resync)

    def _job_changed(self, change: Change) -> None:
        """Wiring: what other parts do when a job changes (called by the job table's commit)."""
        before, after = change
        self.dispatch.job_changed(after)
        self.metrics.job_changed(before, after)
        if after.spec.is_session:
            self.sessions.job_changed(change)
            if after.state != before.state:
                self.kernels.job_changed(after.id, after.state.terminal)
                if after.state.terminal or after.state == JobState.QUEUED:
                    # ended, or back in the queue: its next placement decides its plan anew
                    self.workspace.forget(after.id)
        self.provisioning.job_changed(after)
        if after.state == before.state or not (
            after.state.terminal or after.state == JobState.QUEUED
        ):
            return
        # It left its workers (finished or requeued): their usage changed, so may a placement.
        for wid in before.placement.worker_ids if before.placement else ():
            self.registry.refresh(wid)
        if after.state.terminal:
            self.tails.forget(after.id)
            self.usage.charge_job(after)
        self.scheduling.kick()

    async def _lose_worker(
        self,
        worker_id: str,
        why: str,
        state: WorkerState = WorkerState.LOST,
        *,
        preempted: bool = False,
    ) -> None:
        await self.outcomes.lose_worker(worker_id, why, state, preempted=preempted)
        self.scheduling.kick()

    async def _overdue(self) -> None:
        """The reaper's round: gangs without rendezvous, unconfirmed cancels, budgets."""
        await self.outcomes.overdue()
        await self.provisioning.budgets.watch()


async def _last_try(
    what: str, kept: Callable[[], int], write: Callable[[], Awaitable[None]]
) -> None:
    if not kept():
        return
    try:
        await asyncio.wait_for(write(), LAST_TRY)
    except (GPUlayerError, TimeoutError) as exc:
        why = exc.message if isinstance(exc, GPUlayerError) else f"no answer in {LAST_TRY:g}s"
        log.warning(
            "closing with %d %s the store has not taken (%s): they are lost", kept(), what, why
        )
