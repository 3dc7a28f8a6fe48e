"""Which of several control planes on one PostgreSQL database leads: an advisory lock, an epoch,
and a fence on every write.

- **The lock.** Each ``gpulayer serve`` holds one connection that asks for a session advisory
  lock (``pg_advisory_lock``): the leader has it, a standby's request waits inside PostgreSQL and
  returns the moment the leader's session ends, with no polling. A leader killed outright closes
  its socket and the lock goes at once; a *paused* leader's session is ended by PostgreSQL itself
  after ``session_timeout`` seconds idle (``idle_session_timeout``), because the leader runs a
  cheap query on it every ``beat`` seconds while it lives.
- **The epoch.** Taking over bumps ``gl_leader.epoch`` (and records the new leader's URL, which
  standbys name in their answers) in one transaction.
- **The fence.** Every write transaction of the leader's store first reads the epoch ``FOR
  SHARE`` (``PostgresStore.fence``): a takeover's bump waits for writes in flight, and any later
  write of the old leader finds another epoch and fails before it changes a row. So a leader
  paused past its lease and resumed cannot write: it learns it lost (``lost``) and steps down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ..errors import Unavailable
from ..store.postgres import CONNECT_TIMEOUT, _asyncpg
from ..store.urls import shown

log = logging.getLogger("gpulayer.leadership")

LOCK_KEY = 0x676C_6C64  # "glld"
DEFAULT_BEAT = 1.0
DEFAULT_SESSION_TIMEOUT = 5.0
_TABLE = (
    "CREATE TABLE IF NOT EXISTS gl_leader (id INTEGER PRIMARY KEY, epoch BIGINT NOT NULL, "
    "url TEXT NOT NULL, since DOUBLE PRECISION NOT NULL)"
)


class Leadership:
    """One control plane's claim on a database: ``acquire`` (wait to lead), ``fence``, ``lost``."""

    def __init__(
        self,
        url: str,
        advertise: str,
        *,
        beat: float = DEFAULT_BEAT,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    ) -> None:
        self.url = url
        self.advertise = advertise
        self.beat = beat
        self.session_timeout = session_timeout
        self.epoch: int | None = None
        self.lost = asyncio.Event()
        self._lock_con: Any = None
        self._beater: asyncio.Task[None] | None = None

    async def _connect(self) -> Any:
        asyncpg = _asyncpg()
        try:
            return await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT)
        except Exception as exc:
            raise Unavailable(
                f"cannot reach the database {shown(self.url)} to take part in leadership: {exc}",
                hint="check the --db URL and that PostgreSQL is running",
                code="store_unavailable",
            ) from None

    async def leader_url(self) -> str | None:
        """The URL the current leader advertised (None before any leader)."""
        con = await self._connect()
        try:
            await con.execute(_TABLE)
            return await con.fetchval("SELECT url FROM gl_leader WHERE id = 1")  # type: ignore[no-any-return]
        finally:
            await con.close()

    async def acquire(self) -> int:
        """Wait until this process leads; bump and return the epoch."""
        con = await self._connect()
        try:
            # A paused leader's lock session ends after this long idle: the standby then leads.
            await con.execute(f"SET idle_session_timeout = {int(self.session_timeout * 1000)}")
            await con.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)  # waits inside PostgreSQL
        except BaseException:
            # Cancelled (a standby withdrawing) or failed: the session goes, and its request.
            con.terminate()
            raise
        await con.execute(_TABLE)
        epoch = await con.fetchval(
            "INSERT INTO gl_leader (id, epoch, url, since) VALUES (1, 1, $1, $2) "
            "ON CONFLICT (id) DO UPDATE SET epoch = gl_leader.epoch + 1, url = $1, since = $2 "
            "RETURNING epoch",
            self.advertise,
            time.time(),
        )
        self._lock_con, self.epoch = con, int(epoch)
        self._beater = asyncio.create_task(self._beat())
        log.info("leading %s at epoch %d as %s", shown(self.url), self.epoch, self.advertise)
        return self.epoch

    async def _beat(self) -> None:
        """Keep the lock session busy enough not to be ended; notice when it is gone."""
        try:
            while True:
                await asyncio.sleep(self.beat)  # a lease renewal, not a hot path
                await asyncio.wait_for(self._lock_con.fetchval("SELECT 1"), self.session_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._lose(f"its lock session ended ({type(exc).__name__}: {exc})")

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.error("this control plane lost the leadership: %s; stepping down", why)
            self.lost.set()

    async def fence(self, con: Any) -> None:
        """Run first in every write transaction: refuse it unless this process still leads."""
        epoch = await con.fetchval("SELECT epoch FROM gl_leader WHERE id = 1 FOR SHARE")
        if self.lost.is_set() or epoch != self.epoch:
            self._lose(f"the epoch is {epoch}, ours was {self.epoch}")
            leader = await con.fetchval("SELECT url FROM gl_leader WHERE id = 1")
            raise Unavailable(
                "this control plane is not the leader any more; nothing was written",
                hint="send the request to the leader (clients given several URLs do so)",
                details={"leader": leader, "retry_after": 1},
                code="not_leader",
            )

    async def release(self) -> None:
        if self._beater is not None:
            self._beater.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._beater
        if self._lock_con is not None:
            con, self._lock_con = self._lock_con, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(con.close(), 5.0)
        self._beater = None
        self.epoch = None
