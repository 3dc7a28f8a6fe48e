"""The worker routes of ``/api/v1`` (docs/api-routes.md, ADR 0003): complete handler classes on
``WorkerTokenAuth``, the same in every host (their table is ``routes.WORKER_ROUTES``). Each
operation names the token kinds it accepts; a route with a ``{job_id}`` reaches only jobs
assigned to the caller's worker.

Protocol 1.1 adds ``POST /worker/reports`` (what a worker knows about many attempts, in one
request, each entry answered on its own), small bundles inline in ``Work`` (only to a worker
that says 1.1), and 204 answers to ``Prefer: return=minimal`` on routes whose answer a worker
does not read.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from .. import versions
from ..contracts import (
    FinishReport,
    Job,
    JobReport,
    LogBatch,
    ProgressReport,
    Refusal,
    Rendezvous,
    ReportAnswer,
    ReportBatch,
    Work,
    WorkerInfo,
    WorkerRegistration,
    parse,
)
from ..errors import Forbidden, GPUlayerError, InvalidInput, NotFound, ValidationFailed
from ..security import TokenKind
from ..store.artifacts import check_digest
from .auth import WorkerTokenAuth
from .job_tokens import with_job_tokens
from .longpoll import ClientGone
from .mixin import GLMixin
from .models import BlobStored, JoinAnswer, JoinCheck, LogAck
from .ops import op
from .params import WAIT, Param
from .uploads import Upload

WORKER = (TokenKind.WORKER,)
JOINING = (TokenKind.JOIN, TokenKind.INSTANCE, TokenKind.WORKER)
ATTEMPT = Param(
    "attempt",
    "integer",
    None,
    0,
    1_000_000,
    "the attempt this report comes from (its assignment's `attempt`); a stale one is refused "
    "with 409 `stale_attempt`; absent: the current attempt",
)


def check_artifact_name(name: str, field: str = "name") -> str:
    """An artifact name is a relative path inside the job's output: no ``..``, no root."""
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name or "\x00" in name:
        raise InvalidInput(
            f"artifact {field} {name!r} is not a relative path inside the job's output",
            hint="artifact names look like 'model.pt' or 'rank0/metrics.json'",
            details={"field": field, "name": name},
            code="bad_artifact_name",
        )
    return name


# -- routes -----------------------------------------------------------------------------


class WorkerRoute(GLMixin, WorkerTokenAuth):
    """A worker route: worker tokens only, in every host.

    A route with a ``{job_id}`` answers 403 for a job not assigned to the caller's worker before
    it reads the body: authorization first, validation after.
    """

    async def prepare(self) -> None:
        await super().prepare()
        job_id = self.path_kwargs.get("job_id")
        if not self._finished and job_id is not None and self.principal is not None:
            await self.own_job(job_id)

    async def own_job(self, job_id: str) -> Job:
        """The job, if it is (or an attempt of it was) assigned to this worker; another
        worker's job is 403. A report on a stale attempt goes through, to be refused as such."""
        job = await self.cp.get(job_id)
        if job.id != job_id:
            raise NotFound(f"no job {job_id!r}", code="job_not_found")
        if not self.cp.was_given(self.worker_id, job_id):
            raise _not_yours(job_id)
        return job


class JoinHandler(WorkerRoute):
    route = "/workers/join"

    @op(
        "enrol a worker (join or instance token: always a new worker id) or re-join as itself "
        "(its session token); answers a new session token",
        body=WorkerRegistration,
        answer=JoinAnswer,
        kinds=JOINING,
        errors=(422,),
    )
    async def post(self, body: WorkerRegistration) -> JoinAnswer:
        principal = self.principal
        assert principal is not None
        # Only a worker's own credential keeps its id: its session token, or an instance token
        # issued for that worker id. A join token is shared by every machine an operator enrols,
        # so it never names an existing worker: honouring a ``?worker_id=`` (older workers still
        # send one) would let any holder take over another worker's identity and its jobs.
        keep = principal.worker_id if principal.kind != TokenKind.JOIN else None
        # An instance token is spent only if the enrolment succeeds: a body refused before
        # this point (422) or a failure inside leaves it usable.
        # An instance token names the provider instance this worker runs on (ADR 0010).
        instance = principal.token_id if principal.kind == TokenKind.INSTANCE else None
        async with self.ctx.tokens.spending(principal):
            info = await self.cp.register(
                body.model_copy(update={"transport": "http"}), keep, instance_token=instance
            )
            session = await self.ctx.tokens.issue_worker_session(info.id, name=info.name)
        interval = self.ctx.heartbeat_interval or max(0.2, self.cp.heartbeat_timeout / 3)
        if self.ctx.protocol == "1.0":
            self.gl_exclude = {"protocol"}  # as a server from before 1.1 answered
        return JoinAnswer(
            worker=info,
            session_token=session,
            heartbeat_interval=interval,
            max_wait=self.ctx.limits.max_wait,
            protocol=self.ctx.protocol,
        )

    @op(
        "check a join, instance or session token without using it (scripts/install-worker.sh "
        "asks before it installs anything); an instance token stays unspent",
        answer=JoinCheck,
        kinds=JOINING,
    )
    async def get(self) -> JoinCheck:
        principal = self.principal
        assert principal is not None
        rec = self.ctx.tokens.get(principal.token_id)
        return JoinCheck(
            kind=principal.kind.value,
            token_id=principal.token_id,
            expires_at=rec.expires_at,
            version=self.ctx.version,
        )


class HeartbeatHandler(WorkerRoute):
    route = "/worker/heartbeat"

    @op("I am alive", answer=WorkerInfo, kinds=WORKER, minimal=True)
    async def post(self) -> WorkerInfo:
        return await self.cp.heartbeat(self.worker_id)


class WorkHandler(WorkerRoute):
    route = "/worker/work"

    @op(
        "long-poll for new assignments and cancellations (protocol 1.1: with their small "
        "bundles inline)",
        answer=Work,
        query=(WAIT,),
        kinds=WORKER,
    )
    async def get(self, wait: float) -> Work:
        inline = versions.at_least(self.gl_protocol, 1)
        if not inline:
            self.gl_exclude = {"bundles"}  # a 1.0 worker refuses a field it does not know
        try:
            call = self.cp.next_work(self.worker_id, wait, inline_bundles=inline)
            work = await self.long_poll(wait, call)
        except ClientGone:
            # Closed unanswered: a killed worker's sockets close at once, long before its
            # heartbeat is overdue (issue 12, item 9). Suspect it unless it calls again soon.
            self.cp.worker_disconnected(self.worker_id)
            raise
        if self.client_gone and not work.empty:
            # The worker left between the answer and its delivery: keep the work for its next
            # poll instead of losing the assignment.
            self.cp.return_work(self.worker_id, work)
            self.cp.worker_disconnected(self.worker_id)
            raise ClientGone()
        return await with_job_tokens(self.ctx.tokens, work)


class StartedHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/started"

    @op("the job's process started", answer=Job, query=(ATTEMPT,), kinds=WORKER, minimal=True)
    async def post(self, job_id: str, attempt: int | None) -> Job:
        return await self.cp.report_started(self.worker_id, job_id, attempt)


class LogsHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/logs"

    @op(
        "append log lines (redacted again here)",
        body=LogBatch,
        answer=LogAck,
        kinds=WORKER,
        minimal=True,
    )
    async def post(self, job_id: str, body: LogBatch) -> LogAck:
        seq = await self.cp.append_logs(self.worker_id, job_id, body.lines, body.attempt)
        return LogAck(seq=seq)


class ProgressHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/progress"

    @op(
        "the job's latest progress fields",
        body=ProgressReport,
        answer=None,
        status=204,
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: ProgressReport) -> None:
        await self.cp.report_progress(self.worker_id, job_id, dict(body.fields), body.attempt)


class FinishedHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/finished"

    @op(
        "the job's outcome (idempotent: a repeated report changes nothing)",
        body=FinishReport,
        answer=Job,
        kinds=WORKER,
        minimal=True,
    )
    async def post(self, job_id: str, body: FinishReport) -> Job:
        for i, a in enumerate(body.artifacts):
            check_artifact_name(a.name, f"artifacts[{i}].name")
        return await self.cp.report_finished(self.worker_id, job_id, body)


class ReportsHandler(WorkerRoute):
    since = (1, 1)
    route = "/worker/reports"

    @op(
        "protocol 1.1: what this worker knows about several of its attempts (each entry a "
        "JobReport: started, lines, progress, end, applied in that order; a short job's start "
        "and end in one entry are written together); 204 when every entry was taken, else the "
        "refused ones by index (the others were taken)",
        body=ReportBatch,
        answer=ReportAnswer,
        kinds=WORKER,
        errors=(422,),
    )
    async def post(self, body: ReportBatch) -> ReportAnswer | None:
        refused: list[Refusal] = []
        taken: list[tuple[int, JobReport]] = []
        for i, raw in enumerate(body.reports):
            try:
                entry = parse(JobReport, batch_object(raw, f"reports[{i}]"))
                for j, a in enumerate(entry.finished.artifacts if entry.finished else ()):
                    check_artifact_name(a.name, f"reports[{i}].finished.artifacts[{j}].name")
                if not self.cp.was_given(self.worker_id, entry.job_id):
                    raise _not_yours(entry.job_id)
            except GPUlayerError as exc:
                refused.append(refusal(i, raw, exc))
                continue
            taken.append((i, entry))
        outcomes = await self.cp.report(self.worker_id, [e for _, e in taken])
        for (i, entry), err in zip(taken, outcomes, strict=True):
            if err is not None:
                ids = {"job_id": entry.job_id, "attempt": entry.attempt}
                refused.append(refusal(i, ids, err))
        if not refused:
            return None
        return ReportAnswer(refused=sorted(refused, key=lambda r: r.index))


def batch_object(raw: object, where: str) -> dict[str, object]:
    """A batch entry, which must be a JSON object (validated on its own after this)."""
    if not isinstance(raw, dict):
        raise ValidationFailed(
            f"{where} is a {type(raw).__name__}, not an object",
            hint="each entry of a batch is a JSON object of its own contract",
            details={"field": where},
        )
    return raw


def _not_yours(job_id: str) -> Forbidden:
    return Forbidden(
        f"job {job_id} is not assigned to this worker",
        hint="a worker session token reaches only its own worker's jobs",
        code="not_your_job",
    )


def refusal(index: int, raw: object, exc: GPUlayerError, field: str = "reports") -> Refusal:
    """Why entry ``index`` of a batch was not taken, naming its job where it could be read."""
    ids = raw if isinstance(raw, dict) else {}
    job_id, attempt = ids.get("job_id"), ids.get("attempt")
    return Refusal(
        index=index,
        job_id=job_id if isinstance(job_id, str) else None,
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        code=exc.code,
        status=exc.status,
        message=exc.message
        if exc.message.startswith(f"{field}[")
        else f"{field}[{index}]: " + exc.message,
        hint=exc.hint or None,
    )


class RendezvousHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/rendezvous"

    @op(
        "publish where a multi-node gang meets (rank-0 worker)",
        body=Rendezvous,
        answer=None,
        status=204,
        kinds=WORKER,
    )
    async def post(self, job_id: str, body: Rendezvous) -> None:
        await self.cp.publish_rendezvous(self.worker_id, job_id, body)

    @op(
        "where the gang meets (long-poll with `wait`; 409 until published)",
        answer=Rendezvous,
        query=(WAIT,),
        kinds=WORKER,
    )
    async def get(self, job_id: str, wait: float) -> Rendezvous:
        return await self.long_poll(wait, self.cp.get_rendezvous(self.worker_id, job_id, wait))


class WorkerBlobHandler(WorkerRoute):
    route = "/worker/blobs/{digest}"

    @op("a bundle of one of this worker's jobs", answer="bytes", kinds=WORKER)
    async def get(self, digest: str) -> bytes:
        check_digest(digest)
        me = next((w for w in await self.cp.workers() if w.id == self.worker_id), None)
        for job_id in me.running if me else ():
            job = await self.cp.get(job_id)
            if getattr(job.spec.workload, "bundle", None) == digest:
                return await self.cp.get_blob(digest)
        raise Forbidden(
            f"blob {digest[:12]}… is not the bundle of a job assigned to this worker",
            hint="a worker reads only the bundles of its own jobs",
            code="not_your_blob",
        )

    @op(
        "upload an artifact (streamed to disk; at most `max_blob` bytes); its sha256 must be "
        "the digest",
        body="bytes",
        answer=BlobStored,
        status=201,
        kinds=WORKER,
        errors=(413, 422, 503),
    )
    async def put(self, digest: str, upload: Upload) -> BlobStored:
        return await upload.commit(check_digest(digest))


class LeaveHandler(WorkerRoute):
    route = "/worker/leave"

    @op(
        "a clean exit: unfinished jobs are lost (or retried); the session ends",
        answer=None,
        status=204,
        kinds=WORKER,
    )
    async def post(self) -> None:
        await self.cp.deregister(self.worker_id)
        await self.ctx.tokens.revoke_where(
            lambda r: r.kind == TokenKind.WORKER and r.worker_id == self.worker_id
        )
