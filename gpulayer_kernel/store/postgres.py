"""PostgreSQL metadata store (asyncpg), for a team's served control plane and its standby.

The same statements as SQLite (``sql.SqlStore``), the same numbered migrations
(``sqlite.MIGRATIONS``, with SQLite's types widened here: ``INTEGER`` → ``BIGINT``, ``REAL`` →
``DOUBLE PRECISION``) and the same group commit: every write queued while a transaction runs
rides in the next one, one pipelined ``executemany`` per statement.

- **Migrations** run under a transaction-scoped advisory lock, so an active and a standby
  control plane starting together migrate once; a schema newer than this GPUlayer is refused
  before anything is written.
- **The database going away** (restart, network, failover of PostgreSQL itself): every call
  raises ``Unavailable`` (503, ``store_unavailable``) naming the database and saying what to do;
  the pool reconnects on the next call, so the control plane recovers without a restart.
- **Fencing** (``fence``): the leadership module (``ha/leadership.py``) installs a check that runs
  first in every write transaction, so a control plane that lost its leadership (paused, then
  resumed after a standby took over) cannot write: its transaction fails before any row changes.
  The fence's share lock on the leader row is also what a takeover's bump waits for, so a
  leader paused *inside* a write transaction would hold failover back for as long as it stays
  paused: PostgreSQL ends a transaction idle for ``idle_transaction_timeout`` seconds (as it ends
  the paused leader's lock session, ``ha/leadership.py``). Ours run their statements back to
  back; one idle that long belongs to a stalled process.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import GPUlayerError, InvalidInput, SchemaTooNew, StoreError, Unavailable
from .sql import Run, SqlStore
from .sqlite import LATEST_SCHEMA, MIGRATIONS
from .urls import shown

# Held (per transaction) while migrating: two control planes starting at once migrate once.
MIGRATION_LOCK = 0x676C_6D69  # "glmi"
CONNECT_TIMEOUT = 5.0
Fence = Callable[[Any], Awaitable[None]]


def pg_ddl(sql: str) -> str:
    """A SQLite migration as PostgreSQL runs it: wider integer and float types, no rowid hint."""
    sql = re.sub(r"\bWITHOUT ROWID\b", "", sql)
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


_NUMBERED: dict[str, str] = {}


def numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1, $2, …`` (our statements quote no ``?``)."""
    out = _NUMBERED.get(sql)
    if out is None:
        parts = sql.split("?")
        out = parts[0] + "".join(f"${i}{p}" for i, p in enumerate(parts[1:], 1))
        _NUMBERED[sql] = out
    return out


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise InvalidInput(
            "a postgresql:// store needs the asyncpg package, which is not installed",
            hint="pip install 'gpulayer[postgres]'",
            code="store_driver_missing",
        ) from None
    return asyncpg


class PostgresStore(SqlStore):
    """A MetadataStore on a PostgreSQL database; ``url`` is a ``postgresql://`` DSN."""

    LABEL_CLAUSE = "(body::jsonb -> 'spec' -> 'labels' ->> ?) = ?"

    def __init__(
        self, url: str, *, pool_size: int = 4, idle_transaction_timeout: float = 5.0
    ) -> None:
        super().__init__()
        self.url = url
        self.pool_size = pool_size
        self.idle_transaction_timeout = idle_transaction_timeout
        self.fence: Fence | None = None
        self._pool: Any = None

    @property
    def shown_url(self) -> str:
        return shown(self.url)

    # -- errors ---------------------------------------------------------------------------------

    def _lost(self, exc: BaseException) -> Unavailable:
        return Unavailable(
            f"the database {self.shown_url} is unreachable ({type(exc).__name__}: {exc})",
            hint="the change was not saved: retry when the database answers again (GPUlayer "
            "reconnects on its own; check the PostgreSQL server and the network)",
            details={"store": self.shown_url, "retry_after": 2},
            code="store_unavailable",
        )

    def _is_connection_error(self, exc: BaseException) -> bool:
        asyncpg = _asyncpg()
        return isinstance(
            exc,
            OSError
            | asyncio.TimeoutError
            | asyncpg.InterfaceError
            | asyncpg.PostgresConnectionError
            | asyncpg.exceptions.OperatorInterventionError
            | asyncpg.exceptions.CannotConnectNowError,
        )

    def _write_error(self, exc: Exception) -> GPUlayerError:
        if self._is_connection_error(exc):
            return self._lost(exc)
        return StoreError(f"writing to {self.shown_url} failed: {type(exc).__name__}: {exc}")

    # -- life -----------------------------------------------------------------------------------

    async def open(self) -> None:
        asyncpg = _asyncpg()
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=1,
                max_size=self.pool_size,
                timeout=CONNECT_TIMEOUT,
                # Statements are few and fixed: keep them prepared per connection.
                statement_cache_size=256,
                # A stalled process's open transaction must not hold a takeover (docstring).
                server_settings={
                    "idle_in_transaction_session_timeout": str(
                        int(self.idle_transaction_timeout * 1000)
                    )
                },
            )
        except asyncpg.InvalidCatalogNameError as exc:
            raise StoreError(
                f"cannot open {self.shown_url}: {exc}",
                hint="create the database first (createdb NAME), or fix the URL's last part",
                details={"store": self.shown_url},
                code="store_missing",
            ) from None
        except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError) as e:
            raise StoreError(
                f"the database {self.shown_url} refused the login: {e}",
                hint="check the user and password in the URL (postgresql://USER:PASSWORD@HOST/DB)",
                details={"store": self.shown_url},
                code="store_auth",
            ) from None
        except Exception as exc:
            if self._is_connection_error(exc):
                raise self._lost(exc) from None
            raise StoreError(f"cannot open {self.shown_url}: {exc}") from None
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._drain()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), 5.0)
            except Exception:  # a dead server: do not wait on it
                pool.terminate()

    @property
    def pool(self) -> Any:
        if self._pool is None:
            raise StoreError("the store is not open", hint="call await store.open() first")
        return self._pool

    async def schema_version(self, con: Any) -> int:
        exists = await con.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        if not exists:
            return 0
        version = int(await con.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))
        if version > LATEST_SCHEMA:
            raise SchemaTooNew(
                f"the database {self.shown_url} has schema version {version}, newer than the "
                f"{LATEST_SCHEMA} this GPUlayer understands",
                hint="upgrade GPUlayer (pip install -U gpulayer) on every control plane of this "
                "database; the database was left untouched",
                details={"schema": version, "supported": LATEST_SCHEMA, "store": self.shown_url},
            )
        return version

    async def _migrate(self) -> None:
        async with self.pool.acquire() as con:
            for number, description, sql in MIGRATIONS:
                async with con.transaction():
                    await con.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
                    if number <= await self.schema_version(con):
                        continue
                    for statement in filter(str.strip, sql.split(";")):
                        await con.execute(pg_ddl(statement))
                    await con.execute(
                        "INSERT INTO schema_migrations VALUES ($1, $2, $3)",
                        number,
                        description,
                        time.time(),
                    )
            await self.schema_version(con)  # a newer schema than ours is refused untouched

    # -- the two primitives ---------------------------------------------------------------------

    async def _commit(self, queue: Sequence[Run]) -> None:
        async with self.pool.acquire() as con, con.transaction():
            if self.fence is not None:
                await self.fence(con)
            for run in queue:
                await con.executemany(numbered(run.sql), run.rows)

    async def _fetch_page(
        self,
        sql: str,
        params: Sequence[Any],
        limit: int,
        budget: int,
        size: Callable[[Any], int],
    ) -> tuple[list[Any], bool]:
        rows: list[Any] = []
        used = 0
        try:
            # A cursor (in a transaction, as PostgreSQL's cursors live) fetches a few rows at a
            # time: the rows past the page are never sent here.
            async with self.pool.acquire() as con, con.transaction():
                async for row in con.cursor(numbered(sql), *params, prefetch=8):
                    if len(rows) >= limit or (rows and used >= budget):
                        return rows, True
                    rows.append(row)
                    used += size(row)
        except Exception as exc:
            if self._is_connection_error(exc):
                raise self._lost(exc) from None
            raise
        return rows, False

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return list(await self.pool.fetch(numbered(sql), *params))
        except Exception as exc:
            if self._is_connection_error(exc):
                raise self._lost(exc) from None
            raise
