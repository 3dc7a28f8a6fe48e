"""The metadata store interface (ADR 0008): jobs, logs, sessions, workers, tokens, users, quotas,
secrets, and (ADR 0010, 0011) provider instances, the cost ledger and budgets.

Secret values reach the store already sealed (``security.vault``): a store keeps whatever text it
is given and never sees a plaintext value or the key.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from ..contracts import (
    ADMIN_USER,
    Budget,
    CellRun,
    CostEntry,
    Instance,
    Job,
    JobState,
    LogRecord,
    SessionRecord,
    WorkerInfo,
)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A stored token: only its hash is kept; the secret is shown once at creation."""

    id: str
    kind: str  # client | join | worker | instance
    hash: str
    created_at: float
    expires_at: float | None
    revoked: bool = False
    used: bool = False
    worker_id: str | None = None
    name: str = ""
    # Client tokens belong to a user (``owner``) and may carry a role lower than that user's
    # (``role``; None: the user's own). Other kinds belong to no user.
    owner: str | None = None
    role: str | None = None
    last_used: float | None = None  # when it last authenticated (to the minute: migration 8)


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A person (or a service) that client tokens belong to; ``role`` is admin, user or viewer."""

    name: str
    role: str
    created_at: float
    disabled: bool = False
    group: str | None = None


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    """Limits for ``subject`` (``user:<name>`` or ``group:<name>``); None: no limit."""

    subject: str
    max_gpus: int | None = None
    max_queued: int | None = None


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """One stored secret: its owner, its name and its sealed value (never the plaintext)."""

    owner: str
    name: str
    value: str
    updated_at: float


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A keyed write (ADR 0003): its request's fingerprint, its answer, the jobs it created.

    Scoped by ``owner`` (the caller's user): another user's same key is another record.
    """

    owner: str
    key: str
    fingerprint: str  # sha256 of method, path and canonical body (the owner is the scope)
    created_at: float  # the control plane's clock; the key is new again after its window
    status: int | None = None  # None: not answered yet (in flight, or cut off by a crash)
    answer: str | None = None  # the answer's body as sent ("" for none)
    jobs: tuple[str, ...] = ()  # jobs it created, each noted in the commit that stored it


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit log row (migration 8): who did what to which thing; names and ids only."""

    seq: int
    at: float
    actor: str  # the user (or "worker:<name>", "system")
    role: str | None
    action: str  # e.g. "job.submit", "token.create" (controlplane/audit.py lists them)
    target: str  # the id or name acted on
    detail: dict[str, object]  # small facts: names, ids, counts; never a secret's value


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which audit rows to read: newest first, ``limit`` of them, older than ``before``."""

    actor: str | None = None
    action: str | None = None
    since: float | None = None
    before: int | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class JobQuery:
    states: Sequence[JobState] = ()
    name: str | None = None
    label: tuple[str, str] | None = None
    limit: int = 100
    before_seq: int | None = None
    owner: str | None = None  # only this user's jobs


class MetadataStore(abc.ABC):
    """Durable metadata. Every write method is one transaction; writes are group-committed."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def save_jobs(self, jobs: Sequence[Job]) -> None: ...

    @abc.abstractmethod
    async def get_job(self, job_id: str) -> Job | None: ...

    @abc.abstractmethod
    async def find_job_ids(self, prefix: str, limit: int = 2) -> list[str]: ...

    @abc.abstractmethod
    async def list_jobs(self, query: JobQuery) -> list[Job]: ...

    @abc.abstractmethod
    async def max_job_seq(self) -> int: ...

    @abc.abstractmethod
    async def append_logs(self, job_id: str, records: Sequence[LogRecord]) -> None: ...

    @abc.abstractmethod
    async def read_logs(self, job_id: str, since: int, limit: int) -> list[LogRecord]: ...

    @abc.abstractmethod
    async def read_log_page(
        self, job_id: str, since: int, limit: int, max_bytes: int
    ) -> tuple[list[LogRecord], bool]:
        """At most ``limit`` records after ``since``, stopping once their text and display data
        reach ``max_bytes`` characters (the first record always comes); and whether more wait.
        The rows are read one at a time: a page never holds much more than ``max_bytes``."""

    @abc.abstractmethod
    async def max_log_seq(self, job_id: str) -> int: ...

    async def count_jobs(self) -> dict[str, int]:
        """Jobs per state. A generic fallback; stores override it with one query."""
        counts: dict[str, int] = {}
        for job in await self.list_jobs(JobQuery(limit=1 << 62)):
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        return counts

    # sessions (ADR 0019): their state beside their job, and each cell run in them

    @abc.abstractmethod
    async def save_cells(self, cells: Sequence[CellRun], *, within: float | None = None) -> None:
        """Upsert cells. ``within``: the caller can wait for this write; it rides with the next
        write's transaction, or commits on its own that many seconds from now at the latest
        (None: in the next transaction, as every other write)."""

    @abc.abstractmethod
    async def get_cell(self, session_id: str, number: int) -> CellRun | None: ...

    @abc.abstractmethod
    async def list_cells(
        self, session_id: str, limit: int = 100, before: int | None = None
    ) -> list[CellRun]:
        """A session's cells, newest first (numbers below ``before``)."""

    @abc.abstractmethod
    async def save_sessions(self, sessions: Sequence[SessionRecord]) -> None: ...

    @abc.abstractmethod
    async def load_sessions(self, ids: Sequence[str]) -> list[SessionRecord]: ...

    @abc.abstractmethod
    async def save_workers(self, workers: Sequence[WorkerInfo]) -> None: ...

    @abc.abstractmethod
    async def load_workers(self) -> list[WorkerInfo]: ...

    @abc.abstractmethod
    async def delete_worker(self, worker_id: str) -> None:
        """Forget a removed worker, so it stays removed after a restart (no-op if unknown)."""

    @abc.abstractmethod
    async def save_token(self, token: TokenRecord) -> None: ...

    @abc.abstractmethod
    async def get_token(self, token_id: str) -> TokenRecord | None: ...

    @abc.abstractmethod
    async def list_tokens(self) -> list[TokenRecord]: ...

    # -- users and quotas --------------------------------------------------------------------------

    @abc.abstractmethod
    async def save_user(self, user: UserRecord) -> None:
        """Create or update a user (its name is the key)."""

    @abc.abstractmethod
    async def list_users(self) -> list[UserRecord]: ...

    @abc.abstractmethod
    async def save_quota(self, quota: QuotaRecord) -> None: ...

    @abc.abstractmethod
    async def delete_quota(self, subject: str) -> None: ...

    @abc.abstractmethod
    async def list_quotas(self) -> list[QuotaRecord]: ...

    # -- who may read a blob ---------------------------------------------------------------------

    @abc.abstractmethod
    def add_blob_owners(self, pairs: Sequence[tuple[str, str]]) -> Awaitable[None]:
        """Record ``(digest, user)`` pairs: that user uploaded the bundle or owns the artifact.
        Queued before this returns, so a write the caller makes next commits with them (a run's
        upload and its job: one transaction); awaiting the result waits for that commit."""

    @abc.abstractmethod
    async def blob_owned(self, digest: str, owner: str) -> bool: ...

    # -- secrets (values arrive sealed) ---------------------------------------------------------

    @abc.abstractmethod
    async def set_secret(self, name: str, value: str, *, owner: str = ADMIN_USER) -> None: ...

    @abc.abstractmethod
    async def get_secrets(
        self, names: Sequence[str], *, owner: str = ADMIN_USER
    ) -> dict[str, str]: ...

    @abc.abstractmethod
    async def list_secret_names(self, *, owner: str = ADMIN_USER) -> list[str]: ...

    @abc.abstractmethod
    async def delete_secret(self, name: str, *, owner: str = ADMIN_USER) -> bool: ...

    @abc.abstractmethod
    async def list_secrets(self) -> list[SecretRecord]:
        """Every stored secret of every owner, sealed (to load the redactor, to re-seal)."""

    @abc.abstractmethod
    async def replace_secrets(self, secrets: Sequence[SecretRecord]) -> None:
        """Write these secrets' values in one transaction (a key rotation re-seals them all)."""

    # -- provisioning and accounting (migration 5) ------------------------------------------------

    @abc.abstractmethod
    async def save_instances(self, instances: Sequence[Instance]) -> None:
        """Upsert provider instances by id (written before the provider is called)."""

    @abc.abstractmethod
    async def load_instances(self, *, ended: bool = False, limit: int = 1000) -> list[Instance]:
        """Instances newest first; only those not ended unless ``ended``."""

    @abc.abstractmethod
    async def save_costs(self, entries: Sequence[CostEntry]) -> None:
        """Upsert ledger rows by (job_id, attempt, kind): writing one twice leaves one row."""

    async def save_jobs_and_costs(self, jobs: Sequence[Job], entries: Sequence[CostEntry]) -> None:
        """Jobs and the ledger rows of their changes, in one transaction where the store can
        (the job table's commit path calls this). This default makes two writes."""
        await self.save_jobs(jobs)
        await self.save_costs(entries)

    @abc.abstractmethod
    async def list_costs(
        self, since: float | None = None, job_id: str | None = None
    ) -> list[CostEntry]:
        """Ledger rows recorded at or after ``since`` (of one job, if given), oldest first."""

    @abc.abstractmethod
    async def save_budget(self, budget: Budget) -> None: ...

    @abc.abstractmethod
    async def load_budgets(self) -> list[Budget]: ...

    @abc.abstractmethod
    async def delete_budget(self, name: str) -> bool:
        """Forget a budget; False if there was none of that name."""

    # the cluster's facts (migration 7): its id, the providers config its leader runs

    @abc.abstractmethod
    async def claim_cluster_value(self, name: str, value: str) -> str:
        """The fact ``name``, stored as ``value`` if it was not yet: the first claim wins."""

    @abc.abstractmethod
    async def get_cluster_value(self, name: str) -> str | None: ...

    @abc.abstractmethod
    async def set_cluster_value(self, name: str, value: str) -> None: ...

    # idempotency keys (ADR 0003): one record per (owner, key), replayed to a retry

    @abc.abstractmethod
    def queue_idempotency(self, record: IdempotencyRecord) -> Awaitable[None]:
        """Upsert ``record``, queued before this returns: it commits no later than any write
        queued after it (a job it notes). Awaiting the result waits for that commit."""

    @abc.abstractmethod
    async def save_idempotency(self, record: IdempotencyRecord) -> None:
        """Upsert ``record`` (keyed by owner and key) and wait for its commit."""

    @abc.abstractmethod
    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None: ...

    @abc.abstractmethod
    async def delete_idempotency(self, owner: str, key: str) -> None: ...

    @abc.abstractmethod
    async def purge_idempotency(self, before: float) -> None:
        """Forget every record created before ``before`` (their window is over)."""

    # the audit log and tokens' last use (migration 8, ADR 0020)

    @abc.abstractmethod
    def queue_audit(self, entry: AuditEntry) -> Awaitable[None]:
        """Append ``entry``, queued before this returns: it commits with the next group."""

    @abc.abstractmethod
    async def max_audit_seq(self) -> int: ...

    @abc.abstractmethod
    async def list_audit(self, query: AuditQuery) -> tuple[list[AuditEntry], int]:
        """The page of entries ``query`` asks for (newest first), and how many match in all."""

    @abc.abstractmethod
    def queue_token_use(self, token_id: str, at: float) -> Awaitable[None]:
        """Record that a token was used at ``at`` (queued: commits with the next group)."""

    @abc.abstractmethod
    async def token_uses(self) -> dict[str, float]:
        """Each token's last recorded use."""
