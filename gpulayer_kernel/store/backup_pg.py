"""PostgreSQL's half of ``backup.py``: ``pg_dump`` / ``pg_restore`` in the custom format.

``gl_leader`` (the leadership lease, ``ha/leadership.py``) and ``gl_standby`` (the key ids each
standby holds, ``ha/standby.py``) are left out of the dump: restoring an old epoch would let a
stale leader's writes pass the fence, and a restore keeps the target's own.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..errors import InvalidInput, StoreError
from .backup_format import DATA_TABLES, PG_FILE, not_empty
from .urls import shown

_DEBIAN_BINS = "/usr/lib/postgresql"  # Debian keeps versioned client tools out of PATH
_TIMEOUT = 3600.0


def pg_tool(name: str) -> str:
    """The path of ``pg_dump`` / ``pg_restore``: PATH first, then Debian's newest version."""
    found = shutil.which(name)
    if found:
        return found
    root = Path(_DEBIAN_BINS)
    versions = sorted(
        (p for p in root.glob(f"*/bin/{name}") if p.parent.parent.name.isdigit()),
        key=lambda p: int(p.parent.parent.name),
    )
    if versions:
        return str(versions[-1])
    raise InvalidInput(
        f"{name} is not installed, and a PostgreSQL store is backed up and restored with it",
        hint="install PostgreSQL's client tools (apt-get install postgresql-client), at least "
        "the server's major version",
        code="pg_tools_missing",
    )


def _run(argv: list[str], url: str, what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise StoreError(f"{what} of {shown(url)} took over {_TIMEOUT:g}s; stopped") from None
    if proc.returncode != 0:
        detail = proc.stderr.strip().replace(url, shown(url))[-2000:]
        raise StoreError(
            f"{what} of {shown(url)} failed: {detail}",
            hint="check that the database answers and that the client tools are at least the "
            "server's major version",
            code="pg_tool_failed",
        )


async def schema_and_rows(url: str) -> tuple[int, dict[str, int]]:
    """The database's schema version and row counts of the tables that mean "in use"."""
    from .postgres import _asyncpg

    asyncpg = _asyncpg()
    try:
        con = await asyncpg.connect(url, timeout=10)
    except Exception as exc:
        raise StoreError(
            f"cannot connect to {shown(url)}: {type(exc).__name__}: {exc}",
            hint="check the URL, that the database exists, and that the server answers",
            code="store_unavailable",
        ) from None
    try:
        schema = 0
        if await con.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            schema = int(
                await con.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            )
        rows: dict[str, int] = {}
        for table in DATA_TABLES:
            if await con.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
                rows[table] = int(await con.fetchval(f"SELECT COUNT(*) FROM {table}"))
        return schema, rows
    finally:
        await con.close()


async def backup_postgres(url: str, dest: Path) -> int:
    """``pg_dump`` the database into ``dest/gpulayer.pgdump``; returns its schema version."""
    schema, _ = await schema_and_rows(url)
    target = dest / PG_FILE
    argv = [pg_tool("pg_dump"), "--format=custom", "--no-owner", "--no-privileges"]
    argv += ["--exclude-table=gl_leader", "--exclude-table=gl_standby"]
    argv += [f"--file={target}", f"--dbname={url}"]
    _run(argv, url, "pg_dump")
    target.chmod(0o600)
    return schema


async def restore_postgres(src: Path, url: str, *, force: bool) -> None:
    """``pg_restore`` the backup into ``url``, refusing a database that holds data unless forced."""
    dump = src / PG_FILE
    if not dump.is_file():
        raise InvalidInput(
            f"the backup {src} holds no PostgreSQL dump ({PG_FILE})",
            hint="a SQLite backup restores into a sqlite:// store (--home or --db sqlite:///PATH)",
            code="backup_invalid",
        )
    _, rows = await schema_and_rows(url)
    if any(rows.values()) and not force:
        raise not_empty(shown(url), rows)
    argv = [pg_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error"]
    argv += ["--single-transaction", f"--dbname={url}"]
    if rows:
        # Our tables exist (empty, or --force): drop them first, in the same transaction, so a
        # failed restore leaves the database as it was.
        argv += ["--clean", "--if-exists"]
    _run([*argv, str(dump)], url, "pg_restore")
