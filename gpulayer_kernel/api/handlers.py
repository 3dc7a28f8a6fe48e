"""The user routes of ``/api/v1`` (docs/api-routes.md): parse a contract, call the ControlPlane,
answer a contract. No rule lives here that the ControlPlane or the contracts do not already
enforce, except who may call (tokens) and how big a request may be.

They are mixins mounted on a host's base class (``routes.user_handlers(base, ...)``): the
standalone ``ClientTokenAuth`` or jupyter_server's ``APIHandler``. The worker routes are in
``worker_routes.py``, the route table in ``routes.py``.
"""

from __future__ import annotations

from ..contracts import (
    EventCursor,
    EventPage,
    Job,
    JobList,
    JobSpec,
    JobState,
    LogPage,
    WorkerInfo,
    WorkerState,
    check_secret_name,
)
from ..controlplane import ControlPlane
from ..errors import NotFound
from ..security import Identity, Role, TokenKind, token_state
from ..security.rotation import Rotation
from ..store import TokenRecord
from ..store.artifacts import check_digest
from .mixin import GLMixin
from .models import (
    BlobStored,
    Explanation,
    KeyRotated,
    SecretNames,
    SecretValue,
    Status,
    TokenCreated,
    TokenInfo,
    TokenList,
    TokenRequest,
    WorkerList,
    WorkerStateChange,
)
from .ops import op
from .params import WAIT, Param
from .uploads import Upload
from .worker_routes import check_artifact_name


def token_info(rec: TokenRecord, now: float) -> TokenInfo:
    return TokenInfo(
        id=rec.id,
        kind=rec.kind,
        name=rec.name,
        created_at=rec.created_at,
        expires_at=rec.expires_at,
        state=token_state(rec, now),
        worker_id=rec.worker_id,
        user=rec.owner,
        role=rec.role,  # a Role value, as stored
        last_used=rec.last_used,
    )


# -- user routes (mixins) ----------------------------------------------------------------------


class StatusHandler(GLMixin):
    route = "/status"

    @op("the server's version, live workers and jobs per state", answer=Status, role=Role.VIEWER)
    async def get(self) -> Status:
        live = sum(1 for w in await self.cp.workers() if w.live)
        counts = await self.cp.job_counts()
        return Status(version=self.ctx.version, workers=live, jobs=counts)


class JobsHandler(GLMixin):
    route = "/jobs"

    @op(
        "submit a job",
        body=JobSpec,
        answer=Job,
        status=201,
        errors=(404, 422, 429),
        role=Role.USER,
        idempotent="replay",
    )
    async def post(self, body: JobSpec) -> Job:
        return await self.cp.submit(body, who=self.who, claim=self.gl_claim)

    @op(
        "list jobs, newest first (a user's own; everyone's for admins and viewers)",
        answer=JobList,
        role=Role.VIEWER,
        query=(
            Param("state", "states", description="repeat to ask for several states"),
            Param("name", "string", description="exact job name"),
            Param("label", "label", description="key=value"),
            Param("limit", "integer", 100, 1, 10_000),
        ),
    )
    async def get(
        self,
        state: list[JobState],
        name: str | None,
        label: tuple[str, str] | None,
        limit: float,
    ) -> JobList:
        jobs = await self.cp.list(state, name=name, label=label, limit=int(limit), who=self.who)
        return JobList(jobs=jobs)


class JobHandler(GLMixin):
    route = "/jobs/{job_id}"

    @op(
        "one job (full id or a unique prefix of at least 4 characters)",
        answer=Job,
        role=Role.VIEWER,
    )
    async def get(self, job_id: str) -> Job:
        return await self.cp.get(job_id, who=self.who)


class JobCancelHandler(GLMixin):
    route = "/jobs/{job_id}/cancel"

    @op(
        "cancel a job (its worker stops the process group)",
        answer=Job,
        role=Role.USER,
        idempotent="replay",
    )
    async def post(self, job_id: str) -> Job:
        return await self.cp.cancel(job_id, who=self.who)


class JobLogsHandler(GLMixin):
    route = "/jobs/{job_id}/logs"

    @op(
        "log records after `since` (long-poll with `wait`)",
        answer=LogPage,
        role=Role.VIEWER,
        query=(Param("since", "integer", 0, 0), WAIT, Param("limit", "integer", 1000, 1, 5000)),
    )
    async def get(self, job_id: str, since: float, wait: float, limit: float) -> LogPage:
        call = self.cp.logs(job_id, since=int(since), wait=wait, limit=int(limit), who=self.who)
        return await self.long_poll(wait, call)


class JobWaitHandler(GLMixin):
    route = "/jobs/{job_id}/wait"

    @op(
        "the job once it ends, or as it is at `timeout`",
        answer=Job,
        role=Role.VIEWER,
        query=(Param("timeout", "number", None, 0, "max_wait", "seconds (default: the most)"),),
    )
    async def get(self, job_id: str, timeout: float | None) -> Job:
        wait = self.ctx.limits.max_wait if timeout is None else timeout
        return await self.long_poll(wait, self.cp.wait(job_id, wait, who=self.who))


class JobExplainHandler(GLMixin):
    route = "/jobs/{job_id}/explain"

    @op("why a job waits, or why it went where it went", answer=Explanation, role=Role.VIEWER)
    async def get(self, job_id: str) -> Explanation:
        job = await self.cp.get(job_id, who=self.who)
        return Explanation(job_id=job.id, sentence=await self.cp.explain(job.id, who=self.who))


class JobArtifactHandler(GLMixin):
    route = "/jobs/{job_id}/artifacts/{name:path}"

    @op("the bytes of one of the job's artifacts", answer="bytes", role=Role.VIEWER)
    async def get(self, job_id: str, name: str) -> bytes:
        artifact = await self.cp.artifact_for(job_id, check_artifact_name(name), who=self.who)
        return await self.cp.get_blob(artifact.digest, who=self.who)


class BundleHandler(GLMixin):
    route = "/bundles/{digest}"

    @op("200 when the control plane has this bundle (one you uploaded), else 404", role=Role.VIEWER)
    async def head(self, digest: str) -> None:
        if not await self.cp.has_bundle(check_digest(digest), who=self.who):
            self.set_status(404)
        self.finish()

    @op(
        "upload a bundle (streamed to disk; at most `max_bundle` bytes); its sha256 must be "
        "the digest",
        body="bytes",
        answer=BlobStored,
        status=201,
        errors=(413, 422, 503),
        upload_limit="max_bundle",
        role=Role.USER,
    )
    async def put(self, digest: str, upload: Upload) -> BlobStored:
        stored = await upload.commit(check_digest(digest))
        await self.cp.claim_blob(stored.digest, who=self.who)  # its uploader may run it
        return stored

    @op("download a bundle", answer="bytes", role=Role.VIEWER)
    async def get(self, digest: str) -> bytes:
        return await self.cp.get_bundle(check_digest(digest), who=self.who)


class ArtifactHandler(GLMixin):
    route = "/artifacts/{digest}"

    @op(
        "download a blob (artifact or bundle) by digest: one you uploaded or a job of yours made",
        answer="bytes",
        role=Role.VIEWER,
    )
    async def get(self, digest: str) -> bytes:
        return await self.cp.get_blob(check_digest(digest), who=self.who)


class WorkersHandler(GLMixin):
    route = "/workers"

    @op("every worker with its devices and what runs there", answer=WorkerList, role=Role.VIEWER)
    async def get(self) -> WorkerList:
        return WorkerList(workers=await self.cp.workers(who=self.who))


class WorkerHandler(GLMixin):
    route = "/workers/{worker_id}"

    @op(
        "remove a worker (by id or name) and its stored record; one still running jobs is "
        "refused (409 `worker_busy`) unless `force=1`; its session ends",
        answer=WorkerInfo,
        query=(
            Param(
                "force",
                "integer",
                0,
                0,
                1,
                "1: take its jobs off it first (requeued "
                "if they never started, else retried or lost)",
            ),
        ),
        errors=(404, 409),
        role=Role.ADMIN,
    )
    async def delete(self, worker_id: str, force: float) -> WorkerInfo:
        removed = await self.cp.remove_worker(worker_id, force=bool(force))
        # It cannot come back under this id: a process still running joins as a new worker.
        # Its sessions go, and the instance token whose enrolment made it (a retry of that
        # enrolment would otherwise be this worker again: security/tokens.py).
        await self.ctx.tokens.revoke_where(
            lambda r: r.kind in (TokenKind.WORKER, TokenKind.INSTANCE) and r.worker_id == removed.id
        )
        return removed


class WorkerStateHandler(GLMixin):
    route = "/workers/{worker_id}/state"

    @op(
        "cordon, drain or make ready a worker",
        body=WorkerStateChange,
        answer=WorkerInfo,
        role=Role.ADMIN,
    )
    async def post(self, worker_id: str, body: WorkerStateChange) -> WorkerInfo:
        return await self.cp.set_worker_state(worker_id, WorkerState(body.state))


class EventsHandler(GLMixin):
    route = "/events"

    @op(
        "job and worker changes after `cursor` (or the older `since`); long-poll with `wait`",
        answer=EventPage,
        role=Role.VIEWER,
        query=(
            Param(
                "cursor",
                "string",
                None,
                description="`<epoch>:<seq>`, from a page's `cursor` or /events/cursor; "
                "wins over `since`",
                max_length=64,
            ),
            Param("since", "integer", 0, 0, description="a sequence number (older clients)"),
            WAIT,
        ),
    )
    async def get(self, cursor: str | None, since: float, wait: float) -> EventPage:
        call = self.cp.events(int(since), wait, cursor=cursor, who=self.who)
        return await self.long_poll(wait, call)


class EventCursorHandler(GLMixin):
    route = "/events/cursor"

    @op(
        "where the event log is now: follow from here to see only what happens next",
        answer=EventCursor,
        role=Role.VIEWER,
    )
    async def get(self) -> EventCursor:
        return EventCursor(cursor=await self.cp.event_cursor())


class TokensHandler(GLMixin):
    route = "/tokens"

    @op(
        "tokens (never their secrets): every one for admins, a user's own client tokens",
        answer=TokenList,
        query=(Param("all", "integer", 0, 0, 1, "1: also revoked, expired and used ones"),),
        role=Role.USER,
    )
    async def get(self, all: float) -> TokenList:
        now = self.ctx.tokens.clock()
        recs = self.ctx.tokens.list_for(self.who, include_inactive=bool(all))
        return TokenList(tokens=[token_info(r, now) for r in recs])

    @op(
        "create a token, shown this once: a client token for yourself (admins: for any user, "
        "and join or instance tokens)",
        body=TokenRequest,
        answer=TokenCreated,
        status=201,
        role=Role.USER,
    )
    async def post(self, body: TokenRequest) -> TokenCreated:
        rec, secret = await self.ctx.tokens.create_for(
            self.who, body.kind, ttl=body.ttl, name=body.name, owner=body.user, role=body.role
        )
        return TokenCreated(token=token_info(rec, self.ctx.tokens.clock()), secret=secret)


class TokenRevokeHandler(GLMixin):
    route = "/tokens/{token_id}/revoke"

    @op("revoke a token (it stops working at once)", answer=TokenInfo, role=Role.USER)
    async def post(self, token_id: str) -> TokenInfo:
        rec = await self.ctx.tokens.revoke_for(self.who, token_id)
        return token_info(rec, self.ctx.tokens.clock())


USER_PARAM = Param(
    "user", "string", None, description="admins: another user's secrets", max_length=64
)


class SecretsHandler(GLMixin):
    route = "/secrets"

    @op(
        "names of your stored secrets (values are never returned)",
        answer=SecretNames,
        query=(USER_PARAM, Param("all", "integer", 0, 0, 1, "1 (admins): every user's")),
        role=Role.USER,
    )
    async def get(self, user: str | None, all: float) -> SecretNames:
        if all:
            every = await self.cp.secrets.all(who=self.who)
            return SecretNames(names=[], entries=[f"{r.owner}/{r.name}" for r in every])
        names = await self.cp.secret_names(who=self.who, user=user)
        return SecretNames(names=names, user=user or self.who.user)


class SecretHandler(GLMixin):
    route = "/secrets/{name}"

    @op(
        "store a secret's value (write-only)",
        body=SecretValue,
        answer=None,
        status=204,
        query=(USER_PARAM,),
        role=Role.USER,
    )
    async def put(self, name: str, body: SecretValue, user: str | None) -> None:
        await self.cp.set_secret(check_secret_name(name), body.value, who=self.who, user=user)

    @op("delete a secret", answer=None, status=204, query=(USER_PARAM,), role=Role.USER)
    async def delete(self, name: str, user: str | None) -> None:
        if not await self.cp.delete_secret(check_secret_name(name), who=self.who, user=user):
            raise NotFound(
                f"no secret {name!r}",
                hint="list them with `gpulayer secret list`",
                code="secret_not_found",
            )


class SecretKeyHandler(GLMixin):
    route = "/secrets/rotate-key"

    @op(
        "rotate the key sealing secrets: add, reseal, retire, or all three (admins)",
        answer=KeyRotated,
        query=(
            Param("step", "string", "all", description="add | reseal | retire | all"),
            Param("key", "string", None, description="reseal: the key id to seal with"),
        ),
        role=Role.ADMIN,
    )
    async def post(self, step: str, key: str | None) -> KeyRotated:
        done = await self.cp.secrets.rotation_step(step, key, who=self.who)
        # Key ids and the step only, never key material.
        await audit_rotation(self.cp, self.who, done)
        return key_rotated(done)


async def audit_rotation(cp: ControlPlane, who: Identity | None, done: Rotation) -> None:
    """The rotation's audit row: it names the key the step acted on (``add``: the new key, not
    the one still sealing), with the key sealing now beside it. Key ids only, never material."""
    target = done.added or done.key_id
    await cp.audit.record(
        who,
        "secret.rotate_key",
        target,
        step=done.step,
        sealing=done.key_id,
        retired=list(done.retired),
    )


def key_rotated(done: Rotation) -> KeyRotated:
    """The answer for one rotation step (the CLI's in-process path shares it)."""
    return KeyRotated(
        key_id=done.key_id,
        step=done.step,  # one of STEPS: rotation_step refused any other
        keys=done.keys,
        source=done.source,
        writable=done.writable,
        added=done.added,
        retired=list(done.retired),
    )
