"""The ControlPlane's client side (ADR 0001, 0003): what a user's client calls — submit, read,
follow, cancel and wait for jobs, their logs and artifacts (:class:`JobCalls`), blobs
(:class:`BlobCalls`), events and workers (:class:`ViewCalls`) — each service given, in its
constructor, only the parts it works with (``wiring.py`` builds them). ``ControlPlane`` offers
their calls as its own (``core.py``); they change with the client API.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

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
)
from ..errors import GPUlayerError, NotFound, Unavailable
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
from .follow import LINGER, check_inline_bundle
from .idempotency import Claim
from .jobs import artifact_named
from .visibility import event_seen_by, worker_seen_by

if TYPE_CHECKING:
    from ..security.users import UserService
    from ..store import MetadataStore
    from .audit import AuditLog
    from .blobs import Blobs
    from .events import EventLog
    from .follow import Follower
    from .inline import InlineBundles
    from .jobs import JobTable
    from .logs import LogTails
    from .outcomes import Outcomes
    from .provisioning.part import Provisioning
    from .scheduling import SchedulingLoop
    from .workers import WorkerRegistry


class JobCalls:
    """A user's jobs: submit, read, follow, cancel, wait, explain."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        users: UserService,
        blobs: Blobs,
        jobs: JobTable,
        tails: LogTails,
        outcomes: Outcomes,
        follower: Follower,
        scheduling: SchedulingLoop,
        provisioning: Provisioning,
        audit: AuditLog,
        upload: Callable[..., Awaitable[tuple[str, Awaitable[None]]]],
    ) -> None:
        self.store = store
        self.users = users
        self.blobs = blobs
        self.jobs = jobs
        self.tails = tails
        self.outcomes = outcomes
        self.follower = follower
        self.scheduling = scheduling
        self.provisioning = provisioning
        self.audit = audit
        self.upload = upload  # a run's inline bundle goes where blobs go

    async def submit(
        self, spec: JobSpec, *, who: Identity | None = None, claim: Claim | None = None
    ) -> Job:
        """Queue a job as ``who``'s. A Python workload's bundle must already be uploaded (by
        them: another user's bundle is not theirs to run). ``claim``: the keyed request this
        runs under (ADR 0003), whose earlier try may have made the job already."""
        return await self.enqueue(spec, who=who, claim=claim)

    async def enqueue(
        self,
        spec: JobSpec,
        *,
        who: Identity | None = None,
        added: Callable[[Job], None] | None = None,
        claim: Claim | None = None,
        uploaded: str | None = None,
    ) -> Job:
        """``submit``, telling ``added`` of the job the moment it exists, before any of its
        changes can reach the wiring (the sessions part registers its session there).
        ``uploaded``: the bundle this request has just uploaded (its claim queued)."""
        check_role(who, Role.USER, "submit jobs")
        owner = resolved(who).user
        if claim is not None and (earlier := claim.take(spec, owner)) is not None:
            return earlier  # an earlier try of this request made it: not twice
        bundle = getattr(spec.workload, "bundle", None)  # a session ships no code
        if (
            bundle is not None
            and bundle != uploaded
            and not (await self.blobs.has(bundle, who=who))
        ):
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
        claim: Claim | None = None,
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
        claim: Claim | None = None,
    ) -> JobFollow:
        """Protocol 1.1: submit (with its bundle, when given) and follow, in one call: a short
        job comes back ended, with its result and log tail."""
        uploaded: str | None = None
        claimed: Awaitable[None] | None = None
        if bundle is not None:
            uploaded, claimed = await self.upload(
                bundle, check_inline_bundle(spec, bundle), who=who
            )
        # The upload's claim and the job's row: one commit (no await comes between them).
        job = await self.enqueue(spec, who=who, claim=claim, uploaded=uploaded)
        if claimed is not None:
            await claimed  # committed with the job (or on its own, after an earlier try's job)
        return await self.follower.page(
            job, lambda: self.jobs.get(job.id), wait=wait, linger=linger, limit=limit
        )

    async def submit_many(
        self,
        specs: Sequence[JobSpec],
        *,
        who: Identity | None = None,
        claim: Claim | None = None,
    ) -> builtins.list[Job | GPUlayerError]:
        """Protocol 1.1: several jobs at once (a sweep); each entry's job or refusal. Their
        writes meet in the store's group commits, their placement in one scheduling pass."""
        return list(await asyncio.gather(*(self._submit_one(s, who, claim) for s in specs)))

    async def _submit_one(
        self, spec: JobSpec, who: Identity | None, claim: Claim | None
    ) -> Job | GPUlayerError:
        try:
            return await self.enqueue(spec, who=who, claim=claim)
        except GPUlayerError as exc:
            return exc

    async def explain(self, job_id: str, *, who: Identity | None = None) -> str:
        return self.scheduling.explain(await self.get(job_id, who=who))

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


class BlobCalls:
    """Bundles and artifacts: one content-addressed store (``blobs.Blobs``: who may read
    which); a bundle just put is kept to hand out with its work (``inline``)."""

    def __init__(self, blobs: Blobs, inline: InlineBundles) -> None:
        self.blobs = blobs
        self.inline = inline

    async def put_blob(
        self, data: bytes, digest: str | None = None, *, who: Identity | None = None
    ) -> str:
        stored, claimed = await self.upload(data, digest, who=who)
        await claimed
        return stored

    async def upload(
        self, data: bytes, digest: str | None = None, *, who: Identity | None = None
    ) -> tuple[str, Awaitable[None]]:
        """``put_blob``, its claim queued for the caller's next write (``Blobs.upload``)."""
        stored, claimed = await self.blobs.upload(data, digest, who=who)
        self.inline.keep(stored, data)  # a bundle about to be run: handed out with its work
        return stored, claimed

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


class ViewCalls:
    """What a user sees of the cluster: its workers and the event stream."""

    def __init__(self, registry: WorkerRegistry, jobs: JobTable, event_log: EventLog) -> None:
        self.registry = registry
        self.jobs = jobs
        self.event_log = event_log

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


def _owned_by(event: Event, user: str) -> bool:
    """Whether a user (not an admin or viewer) may see an event: its job's or session's."""
    if event.job is not None:
        return event.job.owner == user
    if event.session is not None:
        return event.session.job.owner == user
    return True
