"""Protocol 1.1 user routes: submit-and-follow in one request, follow in one long-poll, batches.

- ``POST /jobs/run`` submits a job (its bundle may ride inline) and answers its first follow
  page: a job that ends within its ``linger`` comes back ended, with its result and log tail.
- ``GET /jobs/{id}/follow`` is the job and its log records after ``since``, long-polled until
  it changes after ``cursor`` (state, placement, progress, result) or prints.
- ``POST /jobs/batch`` submits many specs; each entry is checked on its own and refused alone.

Thin, as every handler: parse, call one ControlPlane method, answer its contract.
"""

from __future__ import annotations

import base64
import binascii

from ..contracts import JobFollow, JobSpec, Refusal, RunRequest, SubmitAnswer, SubmitBatch, parse
from ..controlplane.follow import LINGER, MAX_LINGER
from ..errors import GPUlayerError, InvalidInput
from ..security import Role
from .mixin import GLMixin
from .ops import op
from .params import WAIT, Param
from .worker_routes import batch_object, refusal

SINCE = Param("since", "integer", 0, 0, description="the last log seq already read")
LINGER_PARAM = Param(
    "linger",
    "number",
    LINGER,
    0,
    MAX_LINGER,
    "seconds a job younger than this is held for its end before the answer (a short job: one "
    "answer, start to result)",
)
LIMIT = Param("limit", "integer", 1000, 1, 5000)


class JobRunHandler(GLMixin):
    since = (1, 1)
    route = "/jobs/run"

    @op(
        "submit a job and follow it in the same request (protocol 1.1): answers its first "
        "follow page, with its result and log tail when it ended within `linger`",
        body=RunRequest,
        answer=JobFollow,
        status=201,
        query=(WAIT, LINGER_PARAM, LIMIT),
        errors=(404, 413, 422, 429),
        role=Role.USER,
        idempotent="follow",
    )
    async def post(self, body: RunRequest, wait: float, linger: float, limit: float) -> JobFollow:
        bundle = None
        if body.bundle is not None:
            try:
                bundle = base64.b64decode(body.bundle, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInput(
                    "bundle is not base64",
                    hint="send the bundle's bytes base64-encoded, or upload it first",
                    details={"field": "bundle"},
                ) from None
        call = self.cp.run(
            body.spec,
            bundle,
            wait=wait,
            linger=linger,
            limit=int(limit),
            who=self.who,
            claim=self.gl_claim,
        )
        return await self.long_poll(max(wait, linger), call)


class JobFollowHandler(GLMixin):
    since = (1, 1)
    route = "/jobs/{job_id}/follow"

    @op(
        "the job and its log records after `since`, answered when it changes after `cursor`, "
        "prints, ends, or at `wait` (protocol 1.1)",
        answer=JobFollow,
        role=Role.VIEWER,
        query=(
            SINCE,
            Param(
                "cursor",
                "string",
                None,
                description="`cursor` of the last page (none: answered at once)",
                max_length=64,
            ),
            WAIT,
            LINGER_PARAM,
            LIMIT,
        ),
    )
    async def get(
        self,
        job_id: str,
        since: float,
        cursor: str | None,
        wait: float,
        linger: float,
        limit: float,
    ) -> JobFollow:
        call = self.cp.follow(job_id, int(since), cursor, wait, linger, int(limit), who=self.who)
        return await self.long_poll(max(wait, linger), call)


class JobBatchHandler(GLMixin):
    since = (1, 1)
    route = "/jobs/batch"

    @op(
        "submit several jobs at once (protocol 1.1): each entry is a JobSpec checked on its own; "
        "the queued jobs in order, and the refused entries by index",
        body=SubmitBatch,
        answer=SubmitAnswer,
        status=201,
        errors=(422,),
        role=Role.USER,
        idempotent="replay",
    )
    async def post(self, body: SubmitBatch) -> SubmitAnswer:
        refused: list[Refusal] = []
        specs: list[tuple[int, JobSpec]] = []
        for i, raw in enumerate(body.specs):
            try:
                specs.append((i, parse(JobSpec, batch_object(raw, f"specs[{i}]"))))
            except GPUlayerError as exc:
                refused.append(refusal(i, None, exc, "specs"))
        outcomes = await self.cp.submit_many(
            [s for _, s in specs], who=self.who, claim=self.gl_claim
        )
        jobs = []
        for (i, _), outcome in zip(specs, outcomes, strict=True):
            if isinstance(outcome, GPUlayerError):
                refused.append(refusal(i, None, outcome, "specs"))
            else:
                jobs.append(outcome)
        return SubmitAnswer(jobs=jobs, refused=sorted(refused, key=lambda r: r.index))
