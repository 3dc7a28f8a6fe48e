"""A job's own token, derived rather than stored (ADR 0022): ``glt_s_<job id>_<mac>``.

The mac is an HMAC-SHA256 of the job id under the cluster's job-token key, made by the first
server that asks and kept among the store's cluster facts, so both servers of an HA pair check
the same tokens. A worker takes one with each assignment: a stored row per job cost a write on
every job's way and a record in the server's memory for ever (served throughput fell from ~1,550
to ~1,110 jobs/s). Derived, it costs one HMAC, and the job's own record says who it acts as and
whether it still lives. It cannot be revoked apart from its job: cancel the job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable

from ..errors import InvalidInput, Unauthorized
from ..store import MetadataStore, TokenRecord

JOB_PREFIX = "job:"  # a job token's name: ``job:<job id>``
JOB_KEY = "job_token_key"  # the cluster fact holding the key (hex)
_JOB_ID = re.compile(r"^[0-9a-f]{12}$")  # controlplane.jobs.new_id's ids


def job_record(job_id: str, owner: str) -> TokenRecord:
    """What a derived job token stands for, in a stored token's shape: its owner, at most the
    user role (``UserService.identity_of`` applies the owner's own role and state)."""
    return TokenRecord(
        job_id, "job", "", 0.0, None, name=f"{JOB_PREFIX}{job_id}", owner=owner, role="user"
    )


class JobTokens:
    """Makes and checks job tokens' macs; knows whose live job is whose through ``owner_of``."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        # The owner of a job that still lives, None once it ended or when unknown
        # (``api.make_context`` wires the control plane's). Without: job tokens are refused.
        self.owner_of: Callable[[str], str | None] | None = None
        self._key: bytes | None = None

    async def mac(self, job_id: str) -> str:
        if not _JOB_ID.match(job_id):
            raise InvalidInput(f"{job_id!r} is not a job id", code="job_token_derived")
        digest = hmac.new(await self.key(), f"{JOB_PREFIX}{job_id}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()

    async def key(self) -> bytes:
        """The cluster's key, claimed in the store by the first server that asks."""
        if self._key is None:
            made = secrets.token_hex(32)
            self._key = bytes.fromhex(await self.store.claim_cluster_value(JOB_KEY, made))
        return self._key

    async def verify(self, job_id: str, mac: str) -> None:
        """Unauthorized unless ``mac`` is this cluster's for ``job_id``."""
        if not hmac.compare_digest(await self.mac(job_id), mac):
            raise Unauthorized(
                f"token {job_id} is not valid",
                hint="ask an operator for a new token (`gpulayer token create`)",
                code="token_invalid",
            )

    def live_owner(self, token_id: str, job_id: str) -> str:
        """The owner of live job ``job_id``; Unauthorized once it ended (or is unknown)."""
        owner = None if self.owner_of is None else self.owner_of(job_id)
        if owner is None:
            raise Unauthorized(
                f"token {token_id} was scoped to job {job_id}, which has ended",
                hint="a job token works while its job runs; outside a job, use a client "
                "token (`gpulayer token create`)",
                code="token_job_ended",
            )
        return owner
