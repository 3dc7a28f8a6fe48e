"""The one ControlPlane (ADR 0001): the public calls, wired over the parts that do the work.

The same object runs in-process (``gpulayer run``, plain IPython, tests), inside the Jupyter server
extension, and behind ``gpulayer serve``. All state changes happen on one asyncio loop and are
written through to the MetadataStore (group-committed) before a call returns, so a crash leaves
every acknowledged change on disk. Each part owns its state and changes only through its methods:
``jobs`` (JobTable: the one commit path of every job change), ``registry`` (workers), ``event_log``
(the ring UIs follow), ``tails`` (job logs), ``dispatch`` (inboxes, cancels, rendezvous),
``scheduling`` (passes, reservations), ``outcomes`` (finishes, cancels, retries, lost workers),
``reaper``, ``sessions`` (ADR 0019), and ``provisioning`` (the cost ledger, budgets, provider
instances and, where the control plane serves workers, the autoscaler: ADR 0010, 0011). Every
wait and timeout runs on ``clock``: tests hand in a FakeClock.

Identity (``security.roles``): calls that read or act on someone's work take ``who`` (an
``Identity``: user and role) and check it with ``check_read``/``check_act``; ``who=None`` is the
embedded single user, who is admin. Jobs carry their ``owner``. ``users`` (UserService) holds
users and quotas, ``secrets`` (SecretTable) each user's sealed secrets, ``usage`` recent GPU use.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Iterable, Sequence

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import (
    Artifact,
    Event,
    EventPage,
    Job,
    JobFollow,
    JobSpec,
    JobState,
    LogPage,
    WorkerInfo,
    WorkerState,
)
from ..errors import GPUlayerError, NotFound, Unavailable
from ..redact import Redactor
from ..scheduler import Snapshot
from ..security.roles import (
    Identity,
    Role,
    check_act,
    check_read,
    check_role,
    resolved,
    sees_all,
)
from ..security.users import UserService
from ..security.vault import MEMORY_KEYS, KeySource
from ..store import ArtifactStore, MetadataStore
from .admin_side import AdminSide
from .audit import AuditLog
from .blobs import Blobs
from .dispatch import Dispatcher
from .events import EventLog
from .follow import LINGER, Follower, check_inline_bundle
from .idempotency import CLAIM
from .inline import InlineBundles
from .jobs import Change, JobTable, artifact_named
from .logs import LogTails
from .metrics import Metrics
from .outcomes import Outcomes
from .provisioning import Provisioning
from .reaper import Reaper
from .reports import Reports
from .scheduling import SchedulingLoop
from .secrets import SecretTable
from .session_side import SessionSide
from .sessions import SessionTable
from .usage import DEFAULT_HALF_LIFE, UsageMeter
from .visibility import event_seen_by, worker_seen_by
from .worker_side import WorkerSide
from .workers import SUSPECT_GRACE, WorkerRegistry


class ControlPlane(WorkerSide, SessionSide, AdminSide):
    """Knows every job and worker; places jobs with the pure scheduler; never polls."""

    def __init__(
        self,
        store: MetadataStore,
        artifacts: ArtifactStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        heartbeat_timeout: float = 30.0,
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
        self.sessions.submit, self.sessions.cancel = self.enqueue, self.cancel
        self.scheduling.session_holds = self._session_holds
        self.registry.on_change = self.scheduling.kick  # a worker under suspicion, or back
        self.audit = AuditLog(store, clock=clock)  # who did what (ADR 0020)
        self.metrics = Metrics(self)  # its own registry: several control planes share a process
        self.metrics.instrument(self.scheduling, store, self.provisioning.ledger)

    # Settings live in the part that uses them; tests and hosts read (and tune) them here.
    @property
    def heartbeat_timeout(self) -> float:
        return self.registry.heartbeat_timeout

    @property
    def reserve_after(self) -> float:
        return self.scheduling.reserve_after

    @reserve_after.setter
    def reserve_after(self, seconds: float) -> None:
        self.scheduling.reserve_after = seconds

    @property
    def rendezvous_timeout(self) -> float:
        return self.outcomes.rendezvous_timeout

    # -- life ------------------------------------------------------------------------------------

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
        self.scheduling.close()
        self.sessions.close()
        await self.provisioning.close()
        await self.reaper.stop()
        self.jobs.close()
        self.dispatch.close()
        self.event_log.close()

    def _job_changed(self, change: Change) -> None:
        """Wiring: what other parts do when a job changes (called by the job table's commit)."""
        before, after = change
        self.dispatch.job_changed(after)
        self.metrics.job_changed(before, after)
        if after.spec.is_session:
            self.sessions.job_changed(change)
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

    # -- client side -----------------------------------------------------------------------------

    async def submit(self, spec: JobSpec, *, who: Identity | None = None) -> Job:
        """Queue a job as ``who``'s. A Python workload's bundle must already be uploaded (by
        them: another user's bundle is not theirs to run)."""
        return await self.enqueue(spec, who=who)

    async def enqueue(
        self,
        spec: JobSpec,
        *,
        who: Identity | None = None,
        added: Callable[[Job], None] | None = None,
    ) -> Job:
        """``submit``, telling ``added`` of the job the moment it exists, before any of its
        changes can reach the wiring (the sessions part registers its session there)."""
        check_role(who, Role.USER, "submit jobs")
        owner = resolved(who).user
        claim = CLAIM.get()  # a keyed request's (ADR 0003): set by the API layer
        if claim is not None and (earlier := claim.take(spec, owner)) is not None:
            return earlier  # an earlier try of this request made it: not twice
        bundle = getattr(spec.workload, "bundle", None)  # a session ships no code
        if bundle is not None and not (await self.blobs.has(bundle, who=who)):
            raise NotFound(
                f"bundle {bundle[:12]}… has not been uploaded",
                hint="upload it with put_bundle (the client and magic do this for you)",
                details={"bundle": bundle},
                code="bundle_not_found",
            )
        self.users.check_submit(
            owner, spec.resources.gpus * spec.resources.nodes, self.jobs.queued_of
        )
        budgets, estimate = self.provisioning.check_submit(spec, owner)  # refused over a budget
        change = self.jobs.add(spec, owner)
        if claim is not None:
            claim.created(change.after)  # queued before the job's row: committed with it
        if added is not None:
            added(change.after)
        self.provisioning.submitted(change.after, budgets, estimate)
        self.tails.open(change.after.id)  # before any await: its first line is numbered 1
        self.scheduling.fresh.add(change.after.id)  # its first pass decides if it can ever fit
        # Queued before the job's row: one group commit carries both (no extra round trip).
        self.audit.record(who, "job.submit", change.after.id, name=spec.name)
        try:
            await self.jobs.flush([change])
        except Unavailable:
            self.jobs.discard(change.after.id)  # not stored: its submitter is told so
            self.tails.forget(change.after.id)
            raise
        self.scheduling.kick()
        return change.after

    async def resolve(self, job_id: str) -> str:
        """Accept a unique id prefix (at least 4 characters), as git does."""
        return await self.jobs.resolve(job_id)

    async def get(self, job_id: str, *, who: Identity | None = None) -> Job:
        job = await self.jobs.get(job_id)
        check_read(who, job.owner, f"job {job_id}")
        return job

    async def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
        who: Identity | None = None,
    ) -> builtins.list[Job]:
        """Jobs, newest first: a user's own; everyone's for admins and viewers."""
        mine = None if sees_all(who) else resolved(who).user
        return await self.jobs.query(states, name=name, label=label, limit=limit, owner=mine)

    async def cancel(
        self, job_id: str, reason: str = "cancelled by user", *, who: Identity | None = None
    ) -> Job:
        job = await self.get(job_id, who=who)
        check_act(who, job.owner, f"job {job_id}")
        self.audit.record(who, "job.cancel", job.id, name=job.spec.name, owner=job.owner)
        return await self.outcomes.cancel(job, reason)

    async def wait(
        self, job_id: str, timeout: float | None = None, *, who: Identity | None = None
    ) -> Job:
        """Return when the job reaches a final state (or at ``timeout`` with its current state)."""
        await self.get(job_id, who=who)
        return await self.jobs.wait(job_id, timeout)

    async def logs(
        self,
        job_id: str,
        since: int = 0,
        wait: float = 0.0,
        limit: int = 1000,
        *,
        who: Identity | None = None,
    ) -> LogPage:
        """Log records after ``since``; with ``wait`` > 0, long-poll until one arrives."""
        job_id = (await self.get(job_id, who=who)).id
        return await self.tails.page(job_id, lambda: self.jobs.get(job_id), since, wait, limit)

    async def follow(
        self,
        job_id: str,
        since: int = 0,
        cursor: str | None = None,
        wait: float = 0.0,
        linger: float = LINGER,
        limit: int = 1000,
        *,
        who: Identity | None = None,
    ) -> JobFollow:
        """Protocol 1.1: the job and its log records after ``since`` in one long-poll, answered
        when it changes after ``cursor``, ends, or at ``wait`` (a job younger than ``linger`` s
        is held until it ends or grows up: a short job is one answer)."""
        job = await self.get(job_id, who=who)
        return await self.follower.page(
            job,
            lambda: self.jobs.get(job.id),
            since=since,
            cursor=cursor,
            wait=wait,
            linger=linger,
            limit=limit,
        )

    async def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = LINGER,
        limit: int = 1000,
        *,
        who: Identity | None = None,
    ) -> JobFollow:
        """Protocol 1.1: submit (with its bundle, when given) and follow, in one call: a short
        job comes back ended, with its result and log tail."""
        if bundle is not None:
            await self.put_bundle(bundle, check_inline_bundle(spec, bundle), who=who)
        job = await self.submit(spec, who=who)
        return await self.follower.page(
            job, lambda: self.jobs.get(job.id), wait=wait, linger=linger, limit=limit
        )

    async def submit_many(
        self, specs: Sequence[JobSpec], *, who: Identity | None = None
    ) -> builtins.list[Job | GPUlayerError]:
        """Protocol 1.1: several jobs at once (a sweep); each entry's job or refusal. Their
        writes meet in the store's group commits, their placement in one scheduling pass."""
        return list(await asyncio.gather(*(self._submit_one(s, who) for s in specs)))

    async def _submit_one(self, spec: JobSpec, who: Identity | None) -> Job | GPUlayerError:
        try:
            return await self.enqueue(spec, who=who)
        except GPUlayerError as exc:
            return exc

    async def explain(self, job_id: str, *, who: Identity | None = None) -> str:
        return self.scheduling.explain(await self.get(job_id, who=who))

    async def workers(self, *, who: Identity | None = None) -> builtins.list[WorkerInfo]:
        """Every worker; a user reads only its own jobs' ids on them (``visibility``)."""
        if sees_all(who):
            return self.registry.all()
        me = resolved(who).user
        return [worker_seen_by(w, me, self.jobs.cached) for w in self.registry.all()]

    async def events(
        self,
        since: int = 0,
        wait: float = 0.0,
        cursor: str | None = None,
        *,
        who: Identity | None = None,
    ) -> EventPage:
        """Job and worker changes after ``cursor`` (or ``since``), long-polled with ``wait``;
        a user sees changes of its own jobs, and every worker's without other users' job ids."""
        if sees_all(who):
            return await self.event_log.page(since, wait, cursor)
        me = resolved(who).user
        page = await self.event_log.page(since, wait, cursor, visible=lambda e: _owned_by(e, me))
        seen = [event_seen_by(e, me, self.jobs.cached) for e in page.events]
        return page.model_copy(update={"events": seen})

    async def event_cursor(self) -> str:
        """The event log's position now: follow from it to see only what happens next."""
        return self.event_log.cursor()

    # blobs: bundles and artifacts share one content-addressed store (``blobs.Blobs``: who may
    # read which)

    async def put_blob(
        self, data: bytes, digest: str | None = None, *, who: Identity | None = None
    ) -> str:
        stored = await self.blobs.put(data, digest, who=who)
        self.inline.keep(stored, data)  # a bundle about to be run: handed out with its work
        return stored

    async def claim_blob(self, digest: str, *, who: Identity | None = None) -> None:
        """Record that ``who`` uploaded the blob ``digest`` (they may read it and run it)."""
        await self.blobs.claim(digest, who=who)

    async def has_blob(self, digest: str, *, who: Identity | None = None) -> bool:
        return await self.blobs.has(digest, who=who)

    async def get_blob(self, digest: str, *, who: Identity | None = None) -> bytes:
        return await self.blobs.get(digest, who=who)

    put_bundle = put_blob
    has_bundle = has_blob
    get_bundle = get_blob

    # -- for the HTTP API (ADR 0003) and tools ---------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The cluster as the scheduler sees it now."""
        return self.scheduling.snapshot()

    async def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (for ``GET /status``)."""
        return await self.store.count_jobs()

    async def artifact_for(
        self, job_id: str, name: str, *, who: Identity | None = None
    ) -> Artifact:
        return artifact_named(await self.get(job_id, who=who), name)


def _owned_by(event: Event, user: str) -> bool:
    """Whether a user (not an admin or viewer) may see an event: its job's or session's."""
    if event.job is not None:
        return event.job.owner == user
    if event.session is not None:
        return event.session.job.owner == user
    return True
