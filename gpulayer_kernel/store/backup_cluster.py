"""Whose machines a restored database may touch: a copy's cluster id, and the original's lock.

Every machine a cluster launches carries its cluster id (``providers/cluster.py``), and a server
lists, adopts and ends the machines tagged with it. A copy of the database that kept the id would
call the live cluster's machines strays and end them every round. So a backup records where it
was taken (``source``: the store URL without its password; for SQLite the home, when it was one)
and the id, and a restore into *another* place makes another cluster, unless the administrator
says it replaces the original (``--as-original``):

- a **copy** gets a new cluster id (``restored_from`` keeps the original's), and every instance
  it recorded as live is marked terminated, "left running" as the original's: a server started
  on the copy with the same providers.toml lists, adopts and ends only the machines it launches;
- **as the original** it keeps the id; refused while the original's leader holds its lock
  (PostgreSQL: the leadership advisory lock in the original database, ``ha/leadership.py``;
  SQLite: the original home's lock file). An original that cannot be reached is said so and
  taken as gone (the usual reason to restore as the original is that it is lost).

A restore into the place the backup was taken (the same database) keeps the id: that is the
original, put back. Written against both stores with plain SQL (sqlite3, asyncpg), before any
server has opened (and migrated) the restored database.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import Conflict

CLUSTER_ID = "cluster_id"  # providers/cluster.py's name for it
RESTORED_FROM = "restored_from"
ENDED = ("terminated", "failed", "preempted")
LOCK_KEY = 0x676C_6C64  # ha/leadership.py's leadership lock ("glld")
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class ClusterOutcome:
    """What a restore did to the cluster id: kept it, or made a copy with a new one."""

    copy: bool
    cluster_id: str | None  # the id the restored database carries now (None: not made yet)
    original: str | None  # the backup's
    left_running: int = 0  # live instances marked as the original's
    note: str = ""  # e.g. the original could not be checked


def is_postgres(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("postgresql", "postgres")


def place(url: str) -> str:
    """Where a store is, comparable between a backup and a restore: a PostgreSQL URL without
    user and password (``postgresql://host:port/db``), a SQLite file's absolute path."""
    if is_postgres(url):
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port or 5432}"
        return urlunsplit(("postgresql", netloc, parts.path, "", ""))
    rest = url.split("://", 1)[1] if "://" in url else url
    return str(Path(rest).resolve())


def without_password(url: str) -> str:
    """The URL to reach a store again later (the password stays out of the backup's files:
    PostgreSQL's own ``PGPASSWORD`` or ``~/.pgpass`` supply it then)."""
    if not is_postgres(url):
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}@{host}" if user else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


# -- reading and writing the cluster facts ---------------------------------------------------


async def cluster_id_of(url: str) -> str | None:
    """The cluster id stored at ``url`` (None: none made yet, or a schema before it)."""
    if is_postgres(url):
        con = await _pg(url)
        try:
            if not await con.fetchval("SELECT to_regclass('cluster') IS NOT NULL"):
                return None
            value = await con.fetchval("SELECT value FROM cluster WHERE name = $1", CLUSTER_ID)
            return None if value is None else str(value)
        finally:
            await con.close()
    return await asyncio.to_thread(_sqlite_cluster_id, Path(place(url)))


def _sqlite_cluster_id(path: Path) -> str | None:
    if not path.is_file():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        if not _sqlite_has(conn, "cluster"):
            return None
        row = conn.execute("SELECT value FROM cluster WHERE name = ?", (CLUSTER_ID,)).fetchone()
        return None if row is None else str(row[0])
    finally:
        conn.close()


def _sqlite_has(conn: sqlite3.Connection, table: str) -> bool:
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(sql, (table,)).fetchone() is not None


def _left_running(body: str, old: str | None, new: str, now: float) -> str:
    data: dict[str, Any] = json.loads(body)
    data.update(
        state="terminated",
        ended_at=now,
        reason=f"left running: it belongs to cluster {old or '?'}, and this database is a "
        f"restored copy (cluster {new})",
    )
    return json.dumps(data)


async def make_copy(url: str) -> tuple[str | None, str, int]:
    """Give the restored database at ``url`` a new cluster id and mark its live instances as the
    original's; returns (the original's id, the new id, instances marked)."""
    new, now = secrets.token_hex(6), time.time()
    if is_postgres(url):
        return await _pg_copy(url, new, now)
    return await asyncio.to_thread(_sqlite_copy, Path(place(url)), new, now)


def _sqlite_copy(path: Path, new: str, now: float) -> tuple[str | None, str, int]:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("BEGIN IMMEDIATE")
        old: str | None = None
        if _sqlite_has(conn, "cluster"):
            row = conn.execute("SELECT value FROM cluster WHERE name = ?", (CLUSTER_ID,))
            found = row.fetchone()
            old = None if found is None else str(found[0])
            upsert = (
                "INSERT INTO cluster (name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value"
            )
            conn.execute(upsert, (CLUSTER_ID, new))
            conn.execute(upsert, (RESTORED_FROM, old or ""))
        marked = 0
        if _sqlite_has(conn, "instances"):
            live = conn.execute(
                f"SELECT id, body FROM instances WHERE state NOT IN ({','.join('?' * len(ENDED))})",
                ENDED,
            ).fetchall()
            for iid, body in live:
                conn.execute(
                    "UPDATE instances SET state = 'terminated', body = ? WHERE id = ?",
                    (_left_running(body, old, new, now), iid),
                )
                marked += 1
        conn.execute("COMMIT")
        return old, new, marked
    finally:
        conn.close()


async def _pg_copy(url: str, new: str, now: float) -> tuple[str | None, str, int]:
    con = await _pg(url)
    try:
        async with con.transaction():
            old: str | None = None
            if await con.fetchval("SELECT to_regclass('cluster') IS NOT NULL"):
                value = await con.fetchval("SELECT value FROM cluster WHERE name = $1", CLUSTER_ID)
                old = None if value is None else str(value)
                upsert = (
                    "INSERT INTO cluster (name, value) VALUES ($1, $2) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
                )
                await con.execute(upsert, CLUSTER_ID, new)
                await con.execute(upsert, RESTORED_FROM, old or "")
            marked = 0
            if await con.fetchval("SELECT to_regclass('instances') IS NOT NULL"):
                rows = await con.fetch(
                    "SELECT id, body FROM instances WHERE state <> ALL($1::text[])", list(ENDED)
                )
                for r in rows:
                    await con.execute(
                        "UPDATE instances SET state = 'terminated', body = $1 WHERE id = $2",
                        _left_running(str(r["body"]), old, new, now),
                        r["id"],
                    )
                    marked += 1
            return old, new, marked
    finally:
        await con.close()


# -- is the original still led? --------------------------------------------------------------


async def leader_holds(url: str) -> bool | None:
    """Whether a control plane leads the PostgreSQL database at ``url`` now (its leadership lock
    is held); None: the database cannot be reached to tell."""
    try:
        con = await _pg(url)
    except Exception:
        return None
    try:
        got = bool(await con.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY))
        if got:
            await con.fetchval("SELECT pg_advisory_unlock($1)", LOCK_KEY)
        return not got
    finally:
        await con.close()


def home_held(home: Path) -> bool:
    """Whether a control plane runs in the SQLite home ``home`` now (its lock file is held)."""
    from ..home import Layout, live_owner

    return bool(live_owner(Layout(home), wait=0))


async def check_original(manifest: dict[str, Any], original: str | None) -> str:
    """Refuse ``--as-original`` while the original's leader holds its lock; the note to print
    when the original could not be checked ("" when it was, and is free)."""
    source = original or str(manifest.get("source") or "")
    cluster = manifest.get("cluster_id") or "?"
    if manifest.get("kind") == "postgresql":
        if not source:
            return "the backup does not say where it was taken: the original was not checked"
        held = await leader_holds(source)
        if held is None:
            return f"the original database ({source}) could not be reached, so it was taken as gone"
        if held:
            raise _original_leads(f"a control plane leads the original database {source}", cluster)
        return ""
    home = manifest.get("home")
    if not home:
        return "the backup does not name the original's home: the original was not checked"
    if home_held(Path(str(home))):
        raise _original_leads(f"a control plane runs in the original's home {home}", cluster)
    return ""


def _original_leads(where: str, cluster: str) -> Conflict:
    return Conflict(
        f"--as-original: {where} (cluster {cluster}); two databases of one cluster would end "
        "each other's machines",
        hint="stop the original's servers first, or restore without --as-original: the copy "
        "gets a cluster of its own and never touches the original's machines",
        details={"cluster": cluster},
        code="original_still_leads",
    )


async def check_target(url: str) -> None:
    """Refuse a restore over a PostgreSQL database a control plane leads now."""
    if is_postgres(url) and await leader_holds(url):
        raise Conflict(
            f"a control plane leads the database {without_password(url)}: a restore under it "
            "would change its state behind its back",
            hint="stop every control plane on that database first (its standbys too)",
            details={"target": without_password(url)},
            code="restore_while_led",
        )


async def _pg(url: str) -> Any:
    from .postgres import _asyncpg

    return await _asyncpg().connect(url, timeout=CONNECT_TIMEOUT)
