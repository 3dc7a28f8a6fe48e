"""A job's own token (ADR 0022): what its code uses to reach the control plane that placed it.

Each assignment a worker takes over HTTP carries a ``job`` token (``glt_s_…``) for the job's
owner, at most the ``user`` role, named ``job:<id>``, among the job's resolved secrets as
``GPULAYER_TOKEN``: it reaches the job's environment as its secrets do, and the worker's log
redaction masks it like one (no extra request on the job's way). The worker adds
``GPULAYER_URL``, so ``%%gpulayer``, the CLI, ``Client()`` and the Trainer's ``JOB:`` checkpoints
inside a job, kernel or session reach this control plane as that user. The token works on user
routes while the job lives (``live_job_owner``), never on the token routes; docs/security.md says
what it may do. It is derived from the job id (``security.job_tokens``), not stored: no write and no
record per job.
"""

from __future__ import annotations

from collections.abc import Callable

from ..contracts import Work
from ..controlplane import ControlPlane
from ..security import TokenService

TOKEN_SECRET = "GPULAYER_TOKEN"  # as ``client.connect`` reads it


async def with_job_tokens(tokens: TokenService, work: Work) -> Work:
    """``work`` with a token for each assignment's job among its secrets."""
    if not work.assignments:
        return work
    given = []
    for a in work.assignments:
        token = await tokens.issue_job_token(a.job.id)
        given.append(a.model_copy(update={"secrets": {**a.secrets, TOKEN_SECRET: token}}))
    return work.model_copy(update={"assignments": given})


def live_job_owner(cp: ControlPlane) -> Callable[[str], str | None]:
    """The owner of a job known to ``cp`` and not final, else None (a job token's check)."""

    def owner(job_id: str) -> str | None:
        job = cp.jobs.cached(job_id)
        return None if job is None or job.state.terminal else job.owner

    return owner
