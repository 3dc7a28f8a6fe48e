"""SQLite metadata store (ADR 0008): WAL, busy_timeout, numbered migrations, group commit.

One thread owns the connection (``sqlite_thread.SqliteThread``): a group commit
(``sql.SqlStore``) is one hand-off to it, whatever the number of statements and rows in the
group, and so is each read.

``MIGRATIONS`` is the one numbered list of schema changes, written in SQL that PostgreSQL also
runs once ``postgres.py`` has widened its types; add new ones here, in portable SQL.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import GPUlayerError, SchemaTooNew, StoreError, Unavailable
from .sql import Run, SqlStore
from .sql_audit import MIGRATION as AUDIT_MIGRATION
from .sql_idempotency import MIGRATION as IDEMPOTENCY_MIGRATION
from .sql_provisioning import CLUSTER_MIGRATION
from .sql_provisioning import MIGRATION as PROVISIONING_MIGRATION
from .sqlite_thread import SqliteThread

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
    (
        3,
        "sessions, their cells, cell output in logs",
        """
        ALTER TABLE logs ADD COLUMN cell INTEGER;
        ALTER TABLE logs ADD COLUMN data TEXT;
        CREATE TABLE sessions (id TEXT PRIMARY KEY, body TEXT NOT NULL);
        CREATE TABLE cells (
            session_id TEXT NOT NULL, number INTEGER NOT NULL, state TEXT NOT NULL,
            body TEXT NOT NULL, PRIMARY KEY (session_id, number)) WITHOUT ROWID;
        """,
    ),
    (
        4,
        "users, roles, quotas, blob owners, secrets per user",
        # Client tokens and secrets from before users belong to the admin; secret values are
        # sealed by the control plane at its next start (security.vault), not by SQL.
        """
        ALTER TABLE jobs ADD COLUMN owner TEXT;
        CREATE INDEX jobs_owner ON jobs(owner, seq);
        ALTER TABLE tokens ADD COLUMN owner TEXT;
        ALTER TABLE tokens ADD COLUMN role TEXT;
        UPDATE tokens SET owner = 'admin' WHERE kind = 'client';
        CREATE TABLE users (
            name TEXT PRIMARY KEY, role TEXT NOT NULL, grp TEXT,
            disabled INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL);
        CREATE TABLE quotas (subject TEXT PRIMARY KEY, max_gpus INTEGER, max_queued INTEGER);
        CREATE TABLE blob_owners (
            digest TEXT NOT NULL, owner TEXT NOT NULL, PRIMARY KEY (digest, owner));
        CREATE TABLE user_secrets (
            owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
            updated_at REAL NOT NULL, PRIMARY KEY (owner, name));
        INSERT INTO user_secrets (owner, name, value, updated_at)
            SELECT 'admin', name, value, updated_at FROM secrets;
        DROP TABLE secrets;
        """,
    ),
    PROVISIONING_MIGRATION,
    IDEMPOTENCY_MIGRATION,
    CLUSTER_MIGRATION,
    AUDIT_MIGRATION,
]
LATEST_SCHEMA = MIGRATIONS[-1][0]


class SqliteStore(SqlStore):
    """The embedded default: one SQLite file in WAL mode."""

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = Path(path) if str(path) != ":memory:" else path
        self._thread: SqliteThread | None = None

    @property
    def thread(self) -> SqliteThread:
        if self._thread is None:
            raise StoreError("the store is not open", hint="call await store.open() first")
        return self._thread

    async def open(self) -> None:
        if isinstance(self.path, Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = SqliteThread(self._connect)
        self._thread.start()
        try:
            await self._thread.call(self._prepare)
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

    def _connect(self) -> sqlite3.Connection:
        # On the store's thread, which alone uses it (sqlite3 checks that it stays there).
        return sqlite3.connect(str(self.path), isolation_level=None)

    def _prepare(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA busy_timeout = 5000")
        version = self._schema_version(conn)  # before WAL: a newer file stays untouched
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # the thread checkpoints (sqlite_thread)
        self._migrate(conn, version)

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("PRAGMA user_version").fetchone()
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

    @staticmethod
    def _migrate(conn: sqlite3.Connection, version: int) -> None:
        for number, description, sql in MIGRATIONS:
            if number <= version:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, sql.split(";")):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (number, description, time.time()),
                )
                conn.execute(f"PRAGMA user_version = {number}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    async def close(self) -> None:
        await self._drain()
        if self._thread is not None:
            thread, self._thread = self._thread, None
            await thread.stop()

    async def _commit(self, queue: Sequence[Run]) -> None:
        await self.thread.call(_commit, queue, rows=sum(len(run.rows) for run in queue))

    def _write_error(self, exc: Exception) -> GPUlayerError:
        return StoreError(f"writing to {self.path} failed: {exc}")

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return await self.thread.call(_fetchall, sql, params)

    async def _fetch_page(
        self,
        sql: str,
        params: Sequence[Any],
        limit: int,
        budget: int,
        size: Callable[[Any], int],
    ) -> tuple[list[Any], bool]:
        return await self.thread.call(_fetch_page, sql, params, limit, budget, size)


def _commit(conn: sqlite3.Connection, queue: Sequence[Run]) -> None:
    """One transaction on the store's thread: every run in queue order, rows in order within
    each (``SqlStore._enqueue`` only merged rows into a run when no other statement on that
    table came between, so this ends where the writes one by one would have)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for run in queue:
            conn.executemany(run.sql, run.rows)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    # A transaction that failed to begin (busy) has nothing to roll back; the error that
    # matters is the one being raised, not "no transaction is active".
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _fetchall(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _fetch_page(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any],
    limit: int,
    budget: int,
    size: Callable[[Any], int],
) -> tuple[list[Any], bool]:
    """One row at a time from the cursor (one thread hop): the rows past the page are never read
    into memory, only the one that says more follow."""
    rows: list[Any] = []
    used = 0
    for row in conn.execute(sql, params):
        if len(rows) >= limit or (rows and used >= budget):
            return rows, True
        rows.append(row)
        used += size(row)
    return rows, False
