"""What the SQL stores share: the group commit and every query, written once (ADR 0008).

``SqliteStore`` and ``PostgresStore`` differ only in how they connect, migrate and run a
transaction; the statements are written here once, with ``?`` placeholders (the PostgreSQL store
numbers them) and in SQL both engines speak (``ON CONFLICT``, ``LIKE … ESCAPE``).

Every write is group-committed (``group.GroupCommit``): it queues its rows and awaits one shared
transaction that carries every write queued while the previous one ran (a single-row transaction
costs a thread hand-off or a network round trip each: 3.2k/s against 298k rows/s batched).
A job's body is encoded by ``encoding.JobEncoder`` (its spec once per job).
"""

from __future__ import annotations

import abc
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import ValidationError

from ..contracts import (
    ADMIN_USER,
    CellRun,
    CostEntry,
    Job,
    JobState,
    LogRecord,
    SessionRecord,
    WorkerInfo,
)
from .base import (
    JobQuery,
    MetadataStore,
    QuotaRecord,
    SecretRecord,
    TokenRecord,
    UserRecord,
)
from .encoding import JobEncoder
from .group import GroupCommit, Run, table_of
from .sql_audit import AuditRows
from .sql_idempotency import IdempotencyRows
from .sql_provisioning import UPSERT_COST, ProvisioningRows, cost_row

__all__ = ["UPSERT_JOB", "Run", "SqlStore", "table_of"]

log = logging.getLogger("gpulayer.store")

UPSERT_JOB = (
    "INSERT INTO jobs (id, seq, state, name, body, updated_at, owner) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET state=excluded.state, body=excluded.body, "
    "updated_at=excluded.updated_at"
)
_STATE_TEXT = {s: s.value for s in JobState}  # a plain str binds faster than the enum member
_INSERT_LOG = (
    "INSERT INTO logs (job_id, seq, time, stream, rank, text, cell, data) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_UPSERT_CELL = (
    "INSERT INTO cells (session_id, number, state, body) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(session_id, number) DO UPDATE SET state=excluded.state, body=excluded.body"
)
_UPSERT_SESSION = (
    "INSERT INTO sessions (id, body) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET body=excluded.body"
)
_UPSERT_WORKER = (
    "INSERT INTO workers (id, name, body) VALUES (?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET name=excluded.name, body=excluded.body"
)
_UPSERT_TOKEN = (
    "INSERT INTO tokens (id, kind, hash, created_at, expires_at, revoked, used, worker_id, name, "
    "owner, role) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
    "revoked=excluded.revoked, used=excluded.used, worker_id=excluded.worker_id, "
    "expires_at=excluded.expires_at"
)
_TOKEN_COLUMNS = (
    "id, kind, hash, created_at, expires_at, revoked, used, worker_id, name, owner, role"
)
_UPSERT_USER = (
    "INSERT INTO users (name, role, grp, disabled, created_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(name) DO UPDATE SET role=excluded.role, grp=excluded.grp, "
    "disabled=excluded.disabled"
)
_UPSERT_QUOTA = (
    "INSERT INTO quotas (subject, max_gpus, max_queued) VALUES (?, ?, ?) "
    "ON CONFLICT(subject) DO UPDATE SET max_gpus=excluded.max_gpus, "
    "max_queued=excluded.max_queued"
)
_UPSERT_SECRET = (
    "INSERT INTO user_secrets (owner, name, value, updated_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(owner, name) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at"
)


class SqlStore(ProvisioningRows, IdempotencyRows, AuditRows, GroupCommit, MetadataStore):
    """A MetadataStore over SQL: subclasses connect, migrate, read and run one transaction
    (``_commit``, from ``GroupCommit``)."""

    def __init__(self) -> None:
        super().__init__()
        self._encode = JobEncoder()

    @abc.abstractmethod
    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    # The one query the engines spell differently: a job's label, inside its JSON body.
    LABEL_CLAUSE = "json_extract(body, '$.spec.labels.' || json_quote(?)) = ?"

    async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    # -- jobs -----------------------------------------------------------------------------------

    def _job_rows(self, jobs: Sequence[Job]) -> list[tuple[Any, ...]]:
        # Both drivers bind TEXT from a str: the encoder's bytes are decoded once, here.
        now, encode, state = time.time(), self._encode, _STATE_TEXT
        return [
            (j.id, j.seq, state[j.state], j.spec.name, encode(j).decode(), now, j.owner)
            for j in jobs
        ]

    async def save_jobs(self, jobs: Sequence[Job]) -> None:
        # The hottest write of all (every transition that matters): kept to one frame.
        if jobs:
            await self._submit(UPSERT_JOB, self._job_rows(jobs))

    async def save_jobs_and_costs(self, jobs: Sequence[Job], entries: Sequence[CostEntry]) -> None:
        """One group commit: the jobs' rows are queued first (no await), then the costs' write
        waits for the transaction that carries both."""
        self._enqueue(UPSERT_JOB, self._job_rows(jobs))
        await self._write(UPSERT_COST, [cost_row(e) for e in entries])

    async def get_job(self, job_id: str) -> Job | None:
        row = await self._fetchone("SELECT body FROM jobs WHERE id = ?", (job_id,))
        return Job.model_validate_json(row[0]) if row else None

    async def find_job_ids(self, prefix: str, limit: int = 2) -> list[str]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = await self._fetchall(
            "SELECT id FROM jobs WHERE id LIKE ? ESCAPE '\\' ORDER BY seq LIMIT ?",
            (escaped + "%", limit),
        )
        return [r[0] for r in rows]

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        where: list[str] = []
        params: list[Any] = []
        if query.states:
            where.append(f"state IN ({','.join('?' * len(query.states))})")
            params.extend(s.value for s in query.states)
        if query.name:
            where.append("name = ?")
            params.append(query.name)
        if query.label:
            where.append(self.LABEL_CLAUSE)
            params.extend(query.label)
        if query.before_seq is not None:
            where.append("seq < ?")
            params.append(query.before_seq)
        if query.owner is not None:
            where.append("COALESCE(owner, ?) = ?")  # rows from before owners: the admin's
            params.extend((ADMIN_USER, query.owner))
        sql = "SELECT body FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        params.append(query.limit)
        rows = await self._fetchall(sql, params)
        return [Job.model_validate_json(r[0]) for r in rows]

    async def count_jobs(self) -> dict[str, int]:
        rows = await self._fetchall("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {r[0]: int(r[1]) for r in rows}

    async def max_job_seq(self) -> int:
        row = await self._fetchone("SELECT COALESCE(MAX(seq), 0) FROM jobs")
        return int(row[0]) if row else 0

    # -- logs -----------------------------------------------------------------------------------

    async def append_logs(self, job_id: str, records: Sequence[LogRecord]) -> None:
        await self._write(
            _INSERT_LOG,
            [
                (
                    job_id,
                    r.seq,
                    r.time,
                    r.stream,
                    r.rank,
                    r.text,
                    r.cell,
                    None if r.data is None else json.dumps(r.data),
                )
                for r in records
            ],
        )

    async def read_logs(self, job_id: str, since: int, limit: int) -> list[LogRecord]:
        rows = await self._fetchall(_READ_LOGS, (job_id, since, limit))
        return [_log_record(r) for r in rows]

    async def read_log_page(
        self, job_id: str, since: int, limit: int, max_bytes: int
    ) -> tuple[list[LogRecord], bool]:
        rows, more = await self._fetch_page(
            _READ_LOGS, (job_id, since, limit + 1), limit, max_bytes, _row_size
        )
        return [_log_record(r) for r in rows], more

    @abc.abstractmethod
    async def _fetch_page(
        self,
        sql: str,
        params: Sequence[Any],
        limit: int,
        budget: int,
        size: Callable[[Any], int],
    ) -> tuple[list[Any], bool]:
        """Rows of ``sql`` one at a time, until ``limit`` rows or ``budget`` by ``size`` (the
        first row always comes); and whether another row follows."""

    async def max_log_seq(self, job_id: str) -> int:
        row = await self._fetchone(
            "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?", (job_id,)
        )
        return int(row[0]) if row else 0

    # -- sessions (ADR 0019) -------------------------------------------------------------------

    async def save_cells(self, cells: Sequence[CellRun], *, within: float | None = None) -> None:
        rows = [(c.session_id, c.number, c.state.value, c.model_dump_json()) for c in cells]
        if within is None:
            await self._write(_UPSERT_CELL, rows)
        elif rows:
            await self._submit_within(_UPSERT_CELL, rows, within)

    async def get_cell(self, session_id: str, number: int) -> CellRun | None:
        row = await self._fetchone(
            "SELECT body FROM cells WHERE session_id = ? AND number = ?", (session_id, number)
        )
        return CellRun.model_validate_json(row[0]) if row else None

    async def list_cells(
        self, session_id: str, limit: int = 100, before: int | None = None
    ) -> list[CellRun]:
        rows = await self._fetchall(
            "SELECT body FROM cells WHERE session_id = ? AND number < ? "
            "ORDER BY number DESC LIMIT ?",
            (session_id, before if before is not None else 1 << 62, limit),
        )
        return [CellRun.model_validate_json(r[0]) for r in rows]

    async def save_sessions(self, sessions: Sequence[SessionRecord]) -> None:
        await self._write(_UPSERT_SESSION, [(s.id, s.model_dump_json()) for s in sessions])

    async def load_sessions(self, ids: Sequence[str]) -> list[SessionRecord]:
        if not ids:
            return []
        rows = await self._fetchall(
            f"SELECT body FROM sessions WHERE id IN ({','.join('?' * len(ids))})", list(ids)
        )
        return [SessionRecord.model_validate_json(r[0]) for r in rows]

    # -- workers --------------------------------------------------------------------------------

    async def save_workers(self, workers: Sequence[WorkerInfo]) -> None:
        await self._write(_UPSERT_WORKER, [(w.id, w.name, w.model_dump_json()) for w in workers])

    async def load_workers(self) -> list[WorkerInfo]:
        workers = []
        for worker_id, body in await self._fetchall("SELECT id, body FROM workers"):
            try:
                workers.append(WorkerInfo.model_validate_json(body))
            except ValidationError as exc:
                # A record stored before the contracts bounded it (an absurd device index) must
                # not stop the control plane from starting: set it aside; the worker re-joins.
                log.warning(
                    "skipping stored worker %s: its record is no longer valid (%s)",
                    worker_id,
                    exc.errors(include_url=False)[0]["msg"],
                )
        return workers

    async def delete_worker(self, worker_id: str) -> None:
        await self._write("DELETE FROM workers WHERE id = ?", [(worker_id,)])

    # -- tokens ---------------------------------------------------------------------------------

    async def save_token(self, token: TokenRecord) -> None:
        t = token
        row = (
            t.id,
            t.kind,
            t.hash,
            t.created_at,
            t.expires_at,
            int(t.revoked),
            int(t.used),
            t.worker_id,
            t.name,
            t.owner,
            t.role,
        )
        await self._write(_UPSERT_TOKEN, [row])

    @staticmethod
    def _token(row: Sequence[Any]) -> TokenRecord:
        return TokenRecord(
            id=row[0],
            kind=row[1],
            hash=row[2],
            created_at=row[3],
            expires_at=row[4],
            revoked=bool(row[5]),
            used=bool(row[6]),
            worker_id=row[7],
            name=row[8],
            owner=row[9],
            role=row[10],
        )

    async def get_token(self, token_id: str) -> TokenRecord | None:
        row = await self._fetchone(f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE id = ?", (token_id,))
        return self._token(row) if row else None

    async def list_tokens(self) -> list[TokenRecord]:
        rows = await self._fetchall(f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY created_at")
        return [self._token(r) for r in rows]

    # -- users and quotas -----------------------------------------------------------------------

    async def save_user(self, user: UserRecord) -> None:
        u = user
        await self._write(_UPSERT_USER, [(u.name, u.role, u.group, int(u.disabled), u.created_at)])

    async def list_users(self) -> list[UserRecord]:
        rows = await self._fetchall(
            "SELECT name, role, grp, disabled, created_at FROM users ORDER BY name"
        )
        return [
            UserRecord(name=r[0], role=r[1], group=r[2], disabled=bool(r[3]), created_at=r[4])
            for r in rows
        ]

    async def save_quota(self, quota: QuotaRecord) -> None:
        q = quota
        await self._write(_UPSERT_QUOTA, [(q.subject, q.max_gpus, q.max_queued)])

    async def delete_quota(self, subject: str) -> None:
        await self._write("DELETE FROM quotas WHERE subject = ?", [(subject,)])

    async def list_quotas(self) -> list[QuotaRecord]:
        rows = await self._fetchall(
            "SELECT subject, max_gpus, max_queued FROM quotas ORDER BY subject"
        )
        return [QuotaRecord(subject=r[0], max_gpus=r[1], max_queued=r[2]) for r in rows]

    def add_blob_owners(self, pairs: Sequence[tuple[str, str]]) -> Awaitable[None]:
        return self._ride(
            "INSERT INTO blob_owners (digest, owner) VALUES (?, ?) ON CONFLICT DO NOTHING",
            list(dict.fromkeys(pairs)),
        )

    async def blob_owned(self, digest: str, owner: str) -> bool:
        row = await self._fetchone(
            "SELECT 1 FROM blob_owners WHERE digest = ? AND owner = ?", (digest, owner)
        )
        return row is not None

    # -- secrets --------------------------------------------------------------------------------

    async def set_secret(self, name: str, value: str, *, owner: str = ADMIN_USER) -> None:
        await self._write(_UPSERT_SECRET, [(owner, name, value, time.time())])

    async def get_secrets(self, names: Sequence[str], *, owner: str = ADMIN_USER) -> dict[str, str]:
        if not names:
            return {}
        rows = await self._fetchall(
            "SELECT name, value FROM user_secrets WHERE owner = ? AND name IN "
            f"({','.join('?' * len(names))})",
            [owner, *names],
        )
        return {r[0]: r[1] for r in rows}

    async def list_secret_names(self, *, owner: str = ADMIN_USER) -> list[str]:
        rows = await self._fetchall(
            "SELECT name FROM user_secrets WHERE owner = ? ORDER BY name", (owner,)
        )
        return [r[0] for r in rows]

    async def delete_secret(self, name: str, *, owner: str = ADMIN_USER) -> bool:
        existed = name in await self.get_secrets([name], owner=owner)
        await self._write("DELETE FROM user_secrets WHERE owner = ? AND name = ?", [(owner, name)])
        return existed

    async def list_secrets(self) -> list[SecretRecord]:
        rows = await self._fetchall(
            "SELECT owner, name, value, updated_at FROM user_secrets ORDER BY owner, name"
        )
        return [SecretRecord(owner=r[0], name=r[1], value=r[2], updated_at=r[3]) for r in rows]

    async def replace_secrets(self, secrets: Sequence[SecretRecord]) -> None:
        await self._write(
            _UPSERT_SECRET, [(s.owner, s.name, s.value, s.updated_at) for s in secrets]
        )


_READ_LOGS = (
    "SELECT seq, time, stream, rank, text, cell, data FROM logs WHERE job_id = ? "
    "AND seq > ? ORDER BY seq LIMIT ?"
)


def _row_size(row: Any) -> int:
    """A log row's text and display data, in characters (what a page's budget counts)."""
    return len(row[4]) + (0 if row[6] is None else len(row[6]))


def _log_record(r: Any) -> LogRecord:
    return LogRecord.model_construct(
        seq=r[0],
        time=r[1],
        stream=r[2],
        rank=r[3],
        text=r[4],
        cell=r[5],
        data=None if r[6] is None else json.loads(r[6]),
    )
