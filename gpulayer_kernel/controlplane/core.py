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
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import (
    Artifact,
    Budget,
    BudgetList,
    BudgetStatus,
    CellPage,
    CellReport,
    CellRequest,
    CellRun,
    CostEntry,
    CostReport,
    Event,
    EventPage,
    FinishReport,
    InstanceList,
    Job,
    JobFollow,
    JobReport,
    JobSpec,
    JobState,
    LogLine,
    LogPage,
    ProviderList,
    Rendezvous,
    SessionHold,
    SessionHolder,
    SessionInfo,
    SessionReport,
    SessionSpec,
    Work,
    WorkerInfo,
    WorkerRegistration,
    WorkerState,
    check_secret_name,
    ensure_json,
)
from ..contracts.costs import GroupBy
from ..errors import Conflict, GPUlayerError, NotFound, Unavailable
from ..redact import Redactor
from ..scheduler import Snapshot
from ..security.roles import (
    Identity,
    Role,
    can_read,
    check_act,
    check_read,
    check_role,
    resolved,
    sees_all,
)
from ..security.users import UserService
from ..security.vault import MEMORY_KEYS, KeySource
from ..store import ArtifactStore, MetadataStore, UserRecord
from ..store.group import GroupCommit
from .audit import AuditLog
from .blobs import Blobs
from .dispatch import Dispatcher
from .events import EventLog
from .follow import LINGER, Follower, check_inline_bundle
from .idempotency import CLAIM
from .inline import InlineBundles
from .jobs import Change, JobTable, artifact_named, new_id
from .logs import LogTails
from .metrics import Metrics
from .outcomes import Outcomes
from .people import end_work_of
from .provisioning import Provisioning
from .reaper import Reaper
from .reports import Reports
from .scheduling import SchedulingLoop
from .secrets import SecretTable
from .sessions import SessionTable
from .usage import DEFAULT_HALF_LIFE, UsageMeter
from .visibility import event_seen_by, worker_seen_by
from .workers import SUSPECT_GRACE, WorkerRegistry


class ControlPlane:
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
        self.scheduling.on_pass = self.metrics.passes.observe
        if isinstance(store, GroupCommit):
            store.on_commit = self.metrics.commits.observe
        ledger = self.provisioning.ledger
        budget_rows = ledger.on_rows

        def on_rows(rows: Sequence[CostEntry]) -> None:
            budget_rows(rows)
            self.metrics.ledger_rows_written(rows)

        ledger.on_rows = on_rows

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

    def _session_holds(self, worker_names: Sequence[str]) -> builtins.list[SessionHold]:
        """Wiring: the sessions holding GPUs on these workers, for a waiting job's sentence."""
        names = set(worker_names)
        holds = []
        for job in self.jobs.active():
            if not job.spec.is_session or job.placement is None:
                continue
            held = self.sessions.hold(job.id)
            for node in job.placement.nodes:
                if node.worker_name in names and node.devices and held is not None:
                    holds.append(
                        SessionHold(
                            session_id=job.id,
                            name=job.spec.name,
                            holder=held[0],
                            worker=node.worker_name,
                            gpus=len(node.devices),
                            idle_since=held[1],
                        )
                    )
        return holds

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

    # secrets: sealed at rest, per owner, resolved for the worker at assignment, never returned

    async def set_secret(
        self, name: str, value: str, *, who: Identity | None = None, user: str | None = None
    ) -> None:
        owner = self.secrets.owner_for(who, user)
        await self.secrets.set(owner, check_secret_name(name), value)
        await self.audit.record(who, "secret.set", name, owner=owner)  # the name, never the value

    async def secret_names(
        self, *, who: Identity | None = None, user: str | None = None
    ) -> builtins.list[str]:
        return await self.secrets.names(self.secrets.owner_for(who, user))

    async def delete_secret(
        self, name: str, *, who: Identity | None = None, user: str | None = None
    ) -> bool:
        owner = self.secrets.owner_for(who, user)
        deleted = await self.secrets.delete(owner, name)
        if deleted:
            await self.audit.record(who, "secret.delete", name, owner=owner)
        return deleted

    # -- users (the records are ``users``'; what disabling one does to their work: people.py) --

    async def update_user(
        self,
        name: str,
        *,
        role: Role | str | None = None,
        group: str | None = None,
        disabled: bool | None = None,
        who: Identity | None = None,
    ) -> UserRecord:
        """Change a user's role or group, or disable (enable) them. Disabling stops their
        sessions and cancels their queued jobs, saying who did it; running jobs finish."""
        check_role(who, Role.ADMIN, "change users")
        was = self.users.get(name).disabled
        rec = await self.users.update(name, role=role, group=group, disabled=disabled)
        await self.audit.record(
            who, "user.update", name, role=rec.role, group=rec.group, disabled=rec.disabled
        )
        if rec.disabled and not was:
            await end_work_of(
                name,
                resolved(who).user,
                sessions=self.sessions.live(),
                jobs=self.jobs.active(),
                stop_session=lambda ref, why: self.stop_session(ref, why),
                cancel=self.outcomes.cancel,
            )
        return rec

    # -- sessions (ADR 0019): the sessions part does the work -----------------------------------
    # A session is its job's owner's: users read and act on their own, viewers read all, admins
    # act on all (``who=None``: the embedded admin). Only its holder runs cells in it.

    async def start_session(self, spec: SessionSpec, *, who: Identity | None = None) -> SessionInfo:
        """Queue a session: a job that holds its GPUs and runs cells until stopped or idle."""
        return await self.sessions.start(spec, who)

    async def list_sessions(
        self, *, include_ended: bool = False, who: Identity | None = None
    ) -> builtins.list[SessionInfo]:
        found = self.sessions.all() if include_ended else self.sessions.live()
        return [s for s in found if can_read(who, s.job.owner)]

    async def get_session(self, ref: str, *, who: Identity | None = None) -> SessionInfo:
        """A session by name or by its job's id (or a unique prefix of it)."""
        s, job = await self.sessions.find(ref, who)
        return self.sessions.info(s, job)

    async def run_cell(
        self, ref: str, request: CellRequest, wait: float = 0.0, *, who: Identity | None = None
    ) -> CellPage:
        """Run a cell in a session; within ``wait`` s the answer carries its output and end."""
        digest = request.inputs_blob
        if digest is not None and not await self.blobs.has(digest, who=who):
            raise NotFound(
                f"blob {digest[:12]}… (the cell's inputs) has not been uploaded",
                hint="upload it with put_blob first (the magics do this for you)",
                code="blob_not_found",
            )
        return await self.sessions.run(ref, request, wait, who)

    async def follow_cell(
        self,
        ref: str,
        number: int,
        since: int = 0,
        wait: float = 0.0,
        *,
        who: Identity | None = None,
    ) -> CellPage:
        """A cell and its output records after ``since``, long-polled with ``wait``."""
        return await self.sessions.follow(ref, number, since, wait, who)

    async def session_cells(
        self, ref: str, limit: int = 100, *, who: Identity | None = None
    ) -> builtins.list[CellRun]:
        return await self.sessions.cells(ref, limit, who)

    async def interrupt_session(self, ref: str, *, who: Identity | None = None) -> SessionInfo:
        return await self.sessions.interrupt(ref, who)

    async def restart_session(self, ref: str, *, who: Identity | None = None) -> SessionInfo:
        return await self.sessions.restart(ref, who)

    async def stop_session(
        self, ref: str, reason: str = "stopped by the user", *, who: Identity | None = None
    ) -> SessionInfo:
        """End a session and free its GPUs; ``reason`` is what its job and cells say."""
        info = await self.sessions.stop(ref, reason, who)
        await self.audit.record(who, "session.stop", info.id, name=info.name)
        return info

    async def attach_session(
        self, ref: str, holder: SessionHolder, *, who: Identity | None = None
    ) -> SessionInfo:
        info = await self.sessions.attach(ref, holder, who)
        await self.audit.record(who, "session.attach", info.id, name=info.name)
        return info

    # -- worker side -----------------------------------------------------------------------------

    async def register(
        self,
        reg: WorkerRegistration,
        worker_id: str | None = None,
        *,
        instance_token: str | None = None,
    ) -> WorkerInfo:
        """Enrol a worker (or re-enrol one after a restart, keeping its id); one that joined with
        an instance token (its id) is the worker of that provider instance."""
        if instance_token is not None:
            worker_id = worker_id or new_id()  # linked to its instance before it can take work
            self.provisioning.joining(instance_token, worker_id, reg.name)
        info = await self.registry.register(reg, worker_id)
        self.scheduling.kick()
        return info

    async def heartbeat(self, worker_id: str) -> WorkerInfo:
        return self.registry.heartbeat(worker_id)

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> WorkerInfo:
        """Cordon (no new work), drain (no new work; finishes what it has) or make ready."""
        info = await self.registry.set_state(worker_id, state)
        self.scheduling.kick()
        return info

    async def next_work(
        self, worker_id: str, wait: float = 0.0, *, inline_bundles: bool = False
    ) -> Work:
        """Long-poll for new assignments and cancellations; answers the moment one exists.
        ``inline_bundles`` (a protocol 1.1 worker): with the small bundles of its assignments."""
        self.registry.polling(worker_id, +1)
        try:
            work = await self.dispatch.next_work(
                worker_id, wait, lambda: self.registry.heartbeat(worker_id)
            )
        finally:
            self.registry.polling(worker_id, -1)
        if inline_bundles and work.assignments:
            work = await self.inline.attach(work)
        return work

    def worker_disconnected(self, worker_id: str) -> None:
        """The worker's long-poll connection closed unanswered: suspect it unless it calls again
        within ``registry.suspect_grace`` seconds (then no new work goes to it)."""
        self.registry.disconnected(worker_id)

    def _owned(self, worker_id: str, job_id: str, attempt: int | None = None) -> Job:
        """The active job a worker reports on, if that worker (known, not lost) holds part of it
        and ``attempt`` is current (else 409 ``stale_attempt``: see ``Outcomes.held``)."""
        return self.outcomes.held(worker_id, job_id, attempt)

    def was_given(self, worker_id: str, job_id: str) -> bool:
        """Whether the worker holds, or was handed, some attempt of the job (a report on a stale
        one is then answered ``stale_attempt``, not "not your job")."""
        job = self.jobs.cached(job_id)
        if job is not None and job.placement is not None and worker_id in job.placement.worker_ids:
            return True
        return self.dispatch.was_given(job_id, worker_id)

    async def report_started(self, worker_id: str, job_id: str, attempt: int | None = None) -> Job:
        job = self._owned(worker_id, job_id, attempt)
        self.dispatch.started(job_id, worker_id)  # never hand this attempt to it again
        if job.state == JobState.PLACED:
            job = await self.jobs.commit(job_id, JobState.RUNNING, started_at=self.clock.now())
        return job

    async def append_logs(
        self,
        worker_id: str,
        job_id: str,
        lines: builtins.list[LogLine],
        attempt: int | None = None,
    ) -> int:
        self._owned(worker_id, job_id, attempt)
        return await self.tails.append(job_id, lines)

    async def report_progress(
        self, worker_id: str, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None:
        self._owned(worker_id, job_id, attempt)
        ensure_json(fields, "progress")
        await self.jobs.note(job_id, progress=fields)  # masked in the job table's commit path

    async def report_finished(self, worker_id: str, job_id: str, report: FinishReport) -> Job:
        """Record a job's outcome. Idempotent: a second report of a finished job changes nothing."""
        entry = JobReport.model_construct(
            job_id=job_id,
            attempt=report.attempt,
            started=False,
            lines=[],
            progress=None,
            finished=report,
        )
        return await self.reports.finish(worker_id, entry)

    async def report(
        self, worker_id: str, reports: Sequence[JobReport]
    ) -> builtins.list[GPUlayerError | None]:
        """Protocol 1.1: several attempts' reports at once (started, lines, progress, end: a
        short job's start is written with its end); each entry's refusal, or None."""
        self.registry.require(worker_id)
        return await self.reports.apply(worker_id, reports)

    async def report_cell(self, worker_id: str, job_id: str, report: CellReport) -> None:
        """A session cell's end on one worker's ranks (idempotent: a repeat changes nothing)."""
        job = self._owned(worker_id, job_id, report.attempt)
        if report.outputs_blob is not None:  # the cell's --out values are its owner's to read
            await self.store.add_blob_owners([(report.outputs_blob, job.owner)])
        await self.sessions.report_cell(worker_id, job, report)

    async def report_session(self, worker_id: str, job_id: str, report: SessionReport) -> None:
        job = self._owned(worker_id, job_id, report.attempt)
        await self.sessions.report_session(worker_id, job, report)

    async def publish_rendezvous(self, worker_id: str, job_id: str, rdzv: Rendezvous) -> None:
        self._owned(worker_id, job_id, rdzv.attempt)
        self.dispatch.publish(job_id, rdzv)

    async def get_rendezvous(self, worker_id: str, job_id: str, wait: float = 0.0) -> Rendezvous:
        """Long-poll for the rank-0 worker's rendezvous record (no sleeps)."""
        return await self.dispatch.rendezvous(job_id, wait, lambda: self._owned(worker_id, job_id))

    async def remove_worker(self, ref: str, *, force: bool = False) -> WorkerInfo:
        """Forget a worker (by id or name) here and in the store; returns it as it was.

        A worker that is gone (lost, offline) just goes. One still in service that holds jobs is
        refused (409 ``worker_busy``) unless ``force``: then it is taken out of service first,
        as if lost (its placed jobs go back to the queue, running ones are retried or lost).
        """
        w = self.registry.find(ref)
        if w.live and w.running and not force:
            raise Conflict(
                f"worker {w.name} is running {len(w.running)} job(s): {', '.join(w.running)}",
                hint="drain it and wait for them, or remove it with --force (placed jobs go "
                "back to the queue; running ones are retried if they may, else lost)",
                details={"worker": w.id, "jobs": w.running},
                code="worker_busy",
            )
        if w.live:
            await self._lose_worker(w.id, "removed by an admin", WorkerState.OFFLINE)
        await self.registry.remove(w.id)
        self.scheduling.kick()
        return w

    async def deregister(self, worker_id: str) -> None:
        """A clean worker exit: its unfinished jobs are lost (or requeued if they may retry)."""
        if self.registry.get(worker_id) is not None:
            await self._lose_worker(worker_id, "its worker shut down", WorkerState.OFFLINE)

    # -- for the HTTP API (ADR 0003) and tools ---------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The cluster as the scheduler sees it now."""
        return self.scheduling.snapshot()

    async def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (for ``GET /status``)."""
        return await self.store.count_jobs()

    def return_work(self, worker_id: str, work: Work) -> None:
        """Put undelivered work back (its long-poll's client left before the answer went out)."""
        if self.registry.get(worker_id) is not None:
            self.dispatch.return_work(
                worker_id, work, lambda j: self.jobs.active_job(j) is not None
            )

    async def artifact_for(
        self, job_id: str, name: str, *, who: Identity | None = None
    ) -> Artifact:
        return artifact_named(await self.get(job_id, who=who), name)

    # -- providers, costs, budgets (ADR 0010, 0011) ----------------------------------------------

    async def providers(self, *, who: Identity | None = None) -> ProviderList:
        """Every configured provider, checked now, with its offers and instance count."""
        check_role(who, Role.VIEWER, "see providers")
        return await self.provisioning.provider_list()

    async def instances(self, ended: bool = False, *, who: Identity | None = None) -> InstanceList:
        """Provider instances, newest first (with ``ended``: the ended ones too)."""
        check_role(who, Role.VIEWER, "see provider instances")
        return await self.provisioning.instance_list(ended)

    async def costs(
        self, by: GroupBy = "job", since: float | None = None, *, who: Identity | None = None
    ) -> CostReport:
        """Estimates and charges summed by user, job, provider, UTC day or project: everyone's
        for admins and viewers, a user's own jobs' for a user."""
        check_role(who, Role.VIEWER, "see costs")
        user = None if sees_all(who) else resolved(who).user
        return await self.provisioning.cost_report(by, since, user=user)

    async def budgets(self, *, who: Identity | None = None) -> BudgetList:
        """Budgets with what they spent and have left (a user: those its jobs spend from)."""
        check_role(who, Role.VIEWER, "see budgets")
        listed = self.provisioning.budget_list()
        if sees_all(who):
            return listed
        me = resolved(who).user
        mine = [s for s in listed.budgets if s.budget.scope != "user" or s.budget.match == me]
        return BudgetList(budgets=mine)

    async def set_budget(self, budget: Budget, *, who: Identity | None = None) -> BudgetStatus:
        check_role(who, Role.ADMIN, "set budgets")
        status = await self.provisioning.set_budget(budget)
        await self.audit.record(who, "budget.set", budget.name, limit=budget.limit)
        return status

    async def delete_budget(self, name: str, *, who: Identity | None = None) -> None:
        check_role(who, Role.ADMIN, "delete budgets")
        await self.provisioning.delete_budget(name)
        await self.audit.record(who, "budget.delete", name)


def _owned_by(event: Event, user: str) -> bool:
    """Whether a user (not an admin or viewer) may see an event: its job's or session's."""
    if event.job is not None:
        return event.job.owner == user
    if event.session is not None:
        return event.session.job.owner == user
    return True
