"""What the SQL stores share: the group commit and every query, written once (ADR 0008).

``SqliteStore`` and ``PostgresStore`` differ only in how they connect, migrate and run a
transaction; the statements are written here once, with ``?`` placeholders (the PostgreSQL store
numbers them) and in SQL both engines speak (``ON CONFLICT``, ``LIKE … ESCAPE``).

**Group commit.** A write queues its rows and awaits one shared transaction that carries every
write queued while the previous one ran (each aiosqlite call hops to a thread, each PostgreSQL
statement is a round trip: 3.2k single-row transactions/s against 298k rows/s batched). Rows of
one statement are merged into one ``executemany`` unless another statement on the same table came
between them, so a transaction always ends where running the writes one by one would have.
A failed transaction fails every write it carried; nothing of it is applied.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..contracts import ADMIN_USER, CellRun, CostEntry, Job, LogRecord, SessionRecord, WorkerInfo
from ..errors import GPUlayerError, StoreError
from .base import (
    JobQuery,
    MetadataStore,
    QuotaRecord,
    SecretRecord,
    TokenRecord,
    UserRecord,
)
from .sql_provisioning import UPSERT_COST, ProvisioningRows, cost_row

log = logging.getLogger("gpulayer.store")

_TABLE = re.compile(r"^\s*(?:INSERT(?: OR \w+)? INTO|DELETE FROM|UPDATE)\s+(\w+)", re.IGNORECASE)

UPSERT_JOB = (
    "INSERT INTO jobs (id, seq, state, name, body, updated_at, owner) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET state=excluded.state, body=excluded.body, "
    "updated_at=excluded.updated_at"
)
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


def table_of(sql: str) -> str:
    """The table a write statement touches (each touches one: no triggers, no joins)."""
    match = _TABLE.match(sql)
    if match is None:
        raise StoreError(f"cannot tell which table this write touches: {sql[:60]}")
    return match.group(1).lower()


@dataclass(slots=True)
class Run:
    """Consecutive rows of one write statement, committed with one ``executemany``."""

    table: str
    sql: str
    rows: list[tuple[Any, ...]]


def _job_rows(jobs: Sequence[Job]) -> list[tuple[Any, ...]]:
    now = time.time()
    return [
        (j.id, j.seq, j.state.value, j.spec.name, j.model_dump_json(), now, j.owner) for j in jobs
    ]


class SqlStore(ProvisioningRows, MetadataStore):
    """A MetadataStore over SQL: subclasses connect, migrate, read and run one transaction."""

    def __init__(self) -> None:
        self._queue: list[Run] = []  # writes waiting for the next commit, in order (``_enqueue``)
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None

    # -- what a subclass provides -----------------------------------------------------------------

    @abc.abstractmethod
    async def _commit(self, queue: Sequence[Run]) -> None:
        """Run ``queue`` in order in one transaction (rolled back whole if any of it fails)."""

    @abc.abstractmethod
    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def _write_error(self, exc: Exception) -> GPUlayerError:
        """What the writers of a failed transaction are told."""
        return StoreError(f"writing to the database failed: {exc}")

    # The one query the engines spell differently: a job's label, inside its JSON body.
    LABEL_CLAUSE = "json_extract(body, '$.spec.labels.' || json_quote(?)) = ?"

    # -- group commit ---------------------------------------------------------------------------

    async def _write(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        self._enqueue(sql, rows)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await fut

    def _enqueue(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Queue rows for the next commit so that it ends as running every write in order would.

        Rows join an earlier run of the same statement (one ``executemany``) unless another
        statement on the same table was queued after that run: a DELETE between two upserts of
        one key must stay between them. Statements on different tables touch different rows, so
        their runs may pass each other.
        """
        table = table_of(sql)
        for run in reversed(self._queue):
            if run.table != table:
                continue
            if run.sql == sql:
                run.rows.extend(rows)
                return
            break
        self._queue.append(Run(table, sql, list(rows)))

    async def _flush(self) -> None:
        while self._queue:
            queue, waiters = self._queue, self._waiters
            self._queue, self._waiters = [], []
            try:
                await self._commit(queue)
            except Exception as exc:
                err = exc if isinstance(exc, GPUlayerError) else self._write_error(exc)
                for w in waiters:
                    if not w.done():
                        w.set_exception(err)
                continue
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def _drain(self) -> None:
        """Let the writes already queued finish (before closing)."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    # -- jobs -----------------------------------------------------------------------------------

    async def save_jobs(self, jobs: Sequence[Job]) -> None:
        await self._write(UPSERT_JOB, _job_rows(jobs))

    async def save_jobs_and_costs(self, jobs: Sequence[Job], entries: Sequence[CostEntry]) -> None:
        """One group commit: the jobs' rows are queued first (no await), then the costs' write
        waits for the transaction that carries both."""
        self._enqueue(UPSERT_JOB, _job_rows(jobs))
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
        rows = await self._fetchall(
            "SELECT seq, time, stream, rank, text, cell, data FROM logs WHERE job_id = ? "
            "AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, since, limit),
        )
        return [
            LogRecord.model_construct(
                seq=r[0],
                time=r[1],
                stream=r[2],
                rank=r[3],
                text=r[4],
                cell=r[5],
                data=None if r[6] is None else json.loads(r[6]),
            )
            for r in rows
        ]

    async def max_log_seq(self, job_id: str) -> int:
        row = await self._fetchone(
            "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?", (job_id,)
        )
        return int(row[0]) if row else 0

    # -- sessions (ADR 0019) -------------------------------------------------------------------

    async def save_cells(self, cells: Sequence[CellRun]) -> None:
        await self._write(
            _UPSERT_CELL,
            [(c.session_id, c.number, c.state.value, c.model_dump_json()) for c in cells],
        )

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

    async def add_blob_owners(self, pairs: Sequence[tuple[str, str]]) -> None:
        await self._write(
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
