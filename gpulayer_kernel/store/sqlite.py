"""SQLite metadata store (ADR 0008): WAL, busy_timeout, numbered migrations, group commit.

Each aiosqlite call hops to the connection's thread (measured: 3.2k single-row transactions/s
against 298k rows/s batched), so writes are *group-committed*: callers queue their rows and await
one shared transaction that carries every write queued while the previous one ran.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
from pydantic import ValidationError

from ..contracts import CostEntry, Job, LogRecord, WorkerInfo
from ..errors import SchemaTooNew, StoreError, Unavailable
from .base import JobQuery, MetadataStore, TokenRecord
from .sqlite_provisioning import MIGRATION as PROVISIONING_MIGRATION
from .sqlite_provisioning import UPSERT_COST, ProvisioningRows, cost_row

log = logging.getLogger("gpulayer.store")

# Numbered migrations; each runs once, in its own transaction, and is recorded in the file.
# Never edit a shipped migration: add a new one.
MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "jobs, logs, workers",
        """
        CREATE TABLE schema_migrations (
            version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL);
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state TEXT NOT NULL,
            name TEXT NOT NULL, body TEXT NOT NULL, updated_at REAL NOT NULL);
        CREATE INDEX jobs_state ON jobs(state, seq);
        CREATE TABLE logs (
            job_id TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, stream TEXT NOT NULL,
            rank INTEGER, text TEXT NOT NULL, PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
        CREATE TABLE workers (id TEXT PRIMARY KEY, name TEXT NOT NULL, body TEXT NOT NULL);
        """,
    ),
    (
        2,
        "tokens and secrets",
        """
        CREATE TABLE tokens (
            id TEXT PRIMARY KEY, kind TEXT NOT NULL, hash TEXT NOT NULL, created_at REAL NOT NULL,
            expires_at REAL, revoked INTEGER NOT NULL DEFAULT 0, used INTEGER NOT NULL DEFAULT 0,
            worker_id TEXT, name TEXT NOT NULL DEFAULT '');
        CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL);
        """,
    ),
    # 3 (sessions) and 4 (identity) belong to other issues; the runner skips numbers at or
    # below the file's version, so the list only needs to stay sorted.
    PROVISIONING_MIGRATION,
]
LATEST_SCHEMA = MIGRATIONS[-1][0]
T = TypeVar("T")

_UPSERT_JOB = (
    "INSERT INTO jobs (id, seq, state, name, body, updated_at) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET state=excluded.state, body=excluded.body, "
    "updated_at=excluded.updated_at"
)
_INSERT_LOG = (
    "INSERT OR IGNORE INTO logs (job_id, seq, time, stream, rank, text) VALUES (?, ?, ?, ?, ?, ?)"
)
_UPSERT_WORKER = (
    "INSERT INTO workers (id, name, body) VALUES (?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET name=excluded.name, body=excluded.body"
)


_TABLE = re.compile(r"^\s*(?:INSERT(?: OR \w+)? INTO|DELETE FROM|UPDATE)\s+(\w+)", re.IGNORECASE)


def _table_of(sql: str) -> str:
    """The table a write statement touches (each touches one: no triggers, no joins)."""
    match = _TABLE.match(sql)
    if match is None:
        raise StoreError(f"cannot tell which table this write touches: {sql[:60]}")
    return match.group(1).lower()


@dataclass(slots=True)
class _Run:
    """Consecutive rows of one write statement, committed with one ``executemany``."""

    table: str
    sql: str
    rows: list[tuple[Any, ...]]


def _job_rows(jobs: Sequence[Job]) -> list[tuple[Any, ...]]:
    now = time.time()
    return [(j.id, j.seq, j.state.value, j.spec.name, j.model_dump_json(), now) for j in jobs]


class SqliteStore(ProvisioningRows, MetadataStore):
    """The embedded default: one SQLite file in WAL mode."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path) if str(path) != ":memory:" else path
        self._db: aiosqlite.Connection | None = None
        self._queue: list[_Run] = []  # writes waiting for the next commit, in order (``_enqueue``)
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StoreError("the store is not open", hint="call await store.open() first")
        return self._db

    async def open(self) -> None:
        if isinstance(self.path, Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = await aiosqlite.connect(str(self.path), isolation_level=None)
            await self._db.execute("PRAGMA busy_timeout = 5000")
            version = await self._schema_version()  # before WAL: a newer file stays untouched
            await self._db.execute("PRAGMA journal_mode = WAL")
            await self._db.execute("PRAGMA synchronous = NORMAL")
            await self._migrate(version)
        except sqlite3.OperationalError as exc:
            await self.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise Unavailable(
                    f"the database {self.path} is locked by another process",
                    hint="another GPUlayer control plane is using this GPULAYER_HOME; connect to "
                    "it, stop it, or set GPULAYER_HOME to another folder",
                    code="store_locked",
                ) from None
            raise StoreError(f"cannot open the database {self.path}: {exc}") from None
        except BaseException:
            await self.close()
            raise

    async def _schema_version(self) -> int:
        async with self.db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        version = int(row[0]) if row else 0
        if version > LATEST_SCHEMA:
            raise SchemaTooNew(
                f"the database {self.path} has schema version {version}, newer than the "
                f"{LATEST_SCHEMA} this GPUlayer understands",
                hint="upgrade GPUlayer (pip install -U gpulayer), or point GPULAYER_HOME at "
                "another folder; the file was left untouched",
                details={"schema": version, "supported": LATEST_SCHEMA, "path": str(self.path)},
            )
        return version

    async def _migrate(self, version: int) -> None:
        for number, description, sql in MIGRATIONS:
            if number <= version:
                continue
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, sql.split(";")):
                    await self.db.execute(statement)
                await self.db.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (number, description, time.time()),
                )
                await self.db.execute(f"PRAGMA user_version = {number}")
                await self.db.execute("COMMIT")
            except BaseException:
                await self.db.execute("ROLLBACK")
                raise

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

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
        table = _table_of(sql)
        for run in reversed(self._queue):
            if run.table != table:
                continue
            if run.sql == sql:
                run.rows.extend(rows)
                return
            break
        self._queue.append(_Run(table, sql, list(rows)))

    async def _flush(self) -> None:
        while self._queue:
            queue, waiters = self._queue, self._waiters
            self._queue, self._waiters = [], []
            try:
                await self._in_thread(self._commit_sync, queue)
            except Exception as exc:
                err = StoreError(f"writing to {self.path} failed: {exc}")
                for w in waiters:
                    if not w.done():
                        w.set_exception(err)
                continue
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        # One hop to the connection's thread for a whole transaction. aiosqlite exposes one call
        # per statement publicly; its ``_execute`` runs any function on that thread (pinned
        # version range in pyproject), which turns 3 + N hops per commit into one.
        return await self.db._execute(fn, *args)  # type: ignore[no-untyped-call,no-any-return]

    def _commit_sync(self, queue: Sequence[_Run]) -> None:
        conn = self.db._conn  # the sqlite3 connection, on its own thread (we are on it)
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Runs in queue order, rows in order within each: ``_enqueue`` only merged rows into
            # a run when no other statement on that table came between, so this transaction
            # ends in the state the writes one by one would have left.
            for run in queue:
                conn.executemany(run.sql, run.rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(await self.db.execute_fetchall(sql, params))

    async def _fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    # -- jobs -----------------------------------------------------------------------------------

    async def save_jobs(self, jobs: Sequence[Job]) -> None:
        await self._write(_UPSERT_JOB, _job_rows(jobs))

    async def save_jobs_and_costs(self, jobs: Sequence[Job], entries: Sequence[CostEntry]) -> None:
        """One group commit: the jobs' rows are queued first (no await), then the costs' write
        waits for the transaction that carries both."""
        self._enqueue(_UPSERT_JOB, _job_rows(jobs))
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
            where.append("json_extract(body, '$.spec.labels.' || json_quote(?)) = ?")
            params.extend(query.label)
        if query.before_seq is not None:
            where.append("seq < ?")
            params.append(query.before_seq)
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
            _INSERT_LOG, [(job_id, r.seq, r.time, r.stream, r.rank, r.text) for r in records]
        )

    async def read_logs(self, job_id: str, since: int, limit: int) -> list[LogRecord]:
        rows = await self._fetchall(
            "SELECT seq, time, stream, rank, text FROM logs WHERE job_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (job_id, since, limit),
        )
        return [
            LogRecord.model_construct(seq=r[0], time=r[1], stream=r[2], rank=r[3], text=r[4])
            for r in rows
        ]

    async def max_log_seq(self, job_id: str) -> int:
        row = await self._fetchone(
            "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?", (job_id,)
        )
        return int(row[0]) if row else 0

    # -- workers --------------------------------------------------------------------------------

    async def save_workers(self, workers: Sequence[WorkerInfo]) -> None:
        await self._write(_UPSERT_WORKER, [(w.id, w.name, w.model_dump_json()) for w in workers])

    async def load_workers(self) -> list[WorkerInfo]:
        rows = await self._fetchall("SELECT id, body FROM workers")
        workers = []
        for worker_id, body in rows:
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

    # -- tokens and secrets ---------------------------------------------------------------------

    async def save_token(self, token: TokenRecord) -> None:
        await self._write(
            "INSERT INTO tokens (id, kind, hash, created_at, expires_at, revoked, used, worker_id,"
            " name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "revoked=excluded.revoked, used=excluded.used, worker_id=excluded.worker_id, "
            "expires_at=excluded.expires_at",
            [
                (
                    token.id,
                    token.kind,
                    token.hash,
                    token.created_at,
                    token.expires_at,
                    int(token.revoked),
                    int(token.used),
                    token.worker_id,
                    token.name,
                )
            ],
        )

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
        )

    _TOKEN_COLUMNS = "id, kind, hash, created_at, expires_at, revoked, used, worker_id, name"

    async def get_token(self, token_id: str) -> TokenRecord | None:
        row = await self._fetchone(
            f"SELECT {self._TOKEN_COLUMNS} FROM tokens WHERE id = ?", (token_id,)
        )
        return self._token(row) if row else None

    async def list_tokens(self) -> list[TokenRecord]:
        rows = await self._fetchall(f"SELECT {self._TOKEN_COLUMNS} FROM tokens ORDER BY created_at")
        return [self._token(r) for r in rows]

    async def set_secret(self, name: str, value: str) -> None:
        await self._write(
            "INSERT INTO secrets (name, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at",
            [(name, value, time.time())],
        )

    async def get_secrets(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        rows = await self._fetchall(
            f"SELECT name, value FROM secrets WHERE name IN ({','.join('?' * len(names))})",
            list(names),
        )
        return {r[0]: r[1] for r in rows}

    async def list_secret_names(self) -> list[str]:
        return [r[0] for r in await self._fetchall("SELECT name FROM secrets ORDER BY name")]

    async def delete_secret(self, name: str) -> bool:
        existed = name in await self.get_secrets([name])
        await self._write("DELETE FROM secrets WHERE name = ?", [(name,)])
        return existed
