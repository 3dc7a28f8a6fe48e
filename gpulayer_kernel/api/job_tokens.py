"""A job's own token (ADR 0022): what its code uses to reach the control plane that placed it.

``POST /worker/jobs/{job_id}/token`` (worker tokens; only the worker the job was given to) makes a
``job`` token for the job's owner, at most the ``user`` role, named ``job:<id>``: the worker puts
it in the job's environment as ``GPULAYER_TOKEN`` beside ``GPULAYER_URL``, so ``%%gpulayer``,
the CLI, ``Client()`` and the Trainer's ``JOB:`` checkpoints inside a job, kernel or session reach
this control plane as that user. It works on user routes while the job lives (``job_lives``),
never on the token routes; docs/security.md says what it may do.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field

from ..contracts import Contract
from ..controlplane import ControlPlane
from .ops import op
from .worker_routes import WORKER, WorkerRoute


class JobToken(Contract):
    """A token scoped to one job (shown once; it stops working when the job ends)."""

    token: str = Field(description="glt_s_…: the job's owner, role at most user")


class WorkerJobTokenHandler(WorkerRoute):
    route = "/worker/jobs/{job_id}/token"

    @op(
        "a token for the code of this job: its owner's, at most the user role, valid while the "
        "job lives",
        answer=JobToken,
        status=201,
        kinds=WORKER,
    )
    async def post(self, job_id: str) -> JobToken:
        job = await self.own_job(job_id)
        return JobToken(token=await self.ctx.tokens.issue_job_token(job.id, job.owner))


def job_lives(cp: ControlPlane) -> Callable[[str], bool]:
    """Whether a job is known to ``cp`` and not final (what a job token's check asks)."""

    def lives(job_id: str) -> bool:
        job = cp.jobs.cached(job_id)
        return job is not None and not job.state.terminal

    return lives
