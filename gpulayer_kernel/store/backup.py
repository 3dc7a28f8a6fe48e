"""Back up and restore a control plane's state: its metadata store and its blobs (ADR 0008).

A backup is a folder (mode 0700: it holds token hashes and sealed secrets)::

    backup.json        what it is: store kind, schema version, GPUlayer version, blob count
    gpulayer.db        SQLite: the online backup API's copy, consistent while the server runs
    gpulayer.pgdump    PostgreSQL: ``pg_dump --format=custom`` (``backup_pg.py``)
    artifacts/ab/ab…   the content-addressed blobs, each verified against its name on copy

Order matters: the database is copied first, the blobs after. A blob is written before any row
names it, so every blob the copied database names is already on disk when the blob copy runs;
the copy may carry a few newer, unnamed blobs too, which cost space and nothing else.

A restore refuses a target database that holds data (``restore_not_empty``) unless forced, and a
backup made by a newer schema than this GPUlayer (``schema_too_new``); an older backup is
migrated by the next ``gpulayer serve``, as any older database is. A refused or failed restore
leaves nothing behind: a SQLite file (and folders) it made for the target are removed.

The manifest also says where the backup was taken and the cluster id it carried: a restore into
another place makes a copy with a cluster of its own unless told it replaces the original
(``backup_cluster.py``: a copy must never end the live cluster's machines).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..contracts._base import SHA256_RE
from ..errors import InvalidInput, SchemaTooNew, StoreError
from .backup_cluster import (
    ClusterOutcome,
    check_original,
    check_target,
    cluster_id_of,
    make_copy,
    place,
    without_password,
)
from .backup_format import BLOBS, DATA_TABLES, FORMAT, MANIFEST, SQLITE_FILE, not_empty
from .sqlite import LATEST_SCHEMA
from .urls import shown

_CHUNK = 1 << 20


@dataclass(frozen=True)
class BackupReport:
    """What a backup or restore did, for the command to print."""

    path: Path
    kind: str  # "sqlite" | "postgresql"
    schema: int
    blobs: int
    blob_bytes: int
    seconds: float
    cluster: ClusterOutcome | None = None  # a restore's: the cluster id kept, or a new one


def is_postgres(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("postgresql", "postgres")


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite:///path`` URL names (``:memory:`` has nothing to back up)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    if rest in ("", "/", "/:memory:"):
        raise InvalidInput(
            f"store URL {shown(url)} names no database file to back up or restore",
            hint="name a file: sqlite:///abs/path/gpulayer.db",
            code="store_url",
        )
    return Path(rest)


# -- the folder ---------------------------------------------------------------------------------


def new_backup_folder(dest: Path) -> None:
    """Make ``dest`` (mode 0700), refusing one that already holds files."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InvalidInput(
            f"{dest} already exists and is not an empty folder",
            hint="back up into a new folder, e.g. one named by the date",
            details={"path": str(dest)},
            code="backup_exists",
        )
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(dest, 0o700)


def write_manifest(dest: Path, **fields: Any) -> None:
    body = {"format": FORMAT, "gpulayer": __version__, "created_at": time.time(), **fields}
    (dest / MANIFEST).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def read_manifest(src: Path) -> dict[str, Any]:
    """The backup's ``backup.json``, checked: a folder without one is not a backup."""
    try:
        body = json.loads((src / MANIFEST).read_text())
    except FileNotFoundError:
        raise InvalidInput(
            f"{src} is not a GPUlayer backup (no {MANIFEST} in it)",
            hint="give the folder `gpulayer db backup PATH` made",
            details={"path": str(src)},
            code="backup_invalid",
        ) from None
    except (OSError, ValueError) as exc:
        raise InvalidInput(
            f"{src / MANIFEST} cannot be read: {exc}", code="backup_invalid"
        ) from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise InvalidInput(
            f"{src / MANIFEST} has a format this GPUlayer does not read",
            hint="restore it with the GPUlayer version that made it",
            details={"format": body.get("format") if isinstance(body, dict) else None},
            code="backup_invalid",
        )
    schema = int(body.get("schema", 0))
    if schema > LATEST_SCHEMA:
        raise SchemaTooNew(
            f"the backup {src} has schema version {schema}, newer than the {LATEST_SCHEMA} "
            "this GPUlayer understands",
            hint=f"restore it with GPUlayer {body.get('gpulayer', '?')} or newer; nothing was "
            "changed",
            details={"schema": schema, "supported": LATEST_SCHEMA, "path": str(src)},
        )
    return body


# -- SQLite -------------------------------------------------------------------------------------


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    # A serving control plane commits in short groups; wait those out rather than fail.
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


def _schema(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _row_counts(conn: sqlite3.Connection) -> dict[str, int]:
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {
        t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
        for t in DATA_TABLES
        if t in have
    }


def sqlite_schema(db: Path) -> int:
    """The schema version of the SQLite file at ``db`` (0: no file, or not ours yet)."""
    if not db.is_file():
        return 0
    conn = _connect(db, readonly=True)
    try:
        return _schema(conn)
    finally:
        conn.close()


def backup_sqlite(db: Path, dest: Path) -> int:
    """Copy ``db`` to ``dest/gpulayer.db`` with the online backup API; returns its schema.

    The copy is one read transaction: under WAL it sees one committed state and never blocks
    the server's writers (they append to the WAL meanwhile).
    """
    if not db.is_file():
        raise InvalidInput(
            f"there is no database at {db}",
            hint="name the control plane's home (--home) or its store (--db sqlite:///PATH)",
            details={"path": str(db)},
            code="backup_source",
        )
    target = dest / SQLITE_FILE
    src = _connect(db, readonly=True)
    try:
        out = sqlite3.connect(str(target))
        try:
            src.backup(out)  # pages=-1: the whole file in one step, so one snapshot
            schema = _schema(out)
            _check_integrity(out, target)
        finally:
            out.close()
    except sqlite3.Error as exc:
        raise StoreError(f"backing up {db} failed: {exc}") from None
    finally:
        src.close()
    os.chmod(target, 0o600)
    return schema


def restore_sqlite(src: Path, db: Path, *, force: bool) -> int:
    """Replace the database at ``db`` with the backup's copy; returns the schema restored."""
    copy = src / SQLITE_FILE
    if not copy.is_file():
        raise InvalidInput(
            f"the backup {src} holds no SQLite database ({SQLITE_FILE})",
            hint="a PostgreSQL backup restores into a postgresql:// store (--db)",
            code="backup_invalid",
        )
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        backup = _connect(copy, readonly=True)
        try:
            _check_integrity(backup, copy)
            out = _connect(db, readonly=False)
            try:
                rows = _row_counts(out)
                if any(rows.values()) and not force:
                    raise not_empty(str(db), rows)
                # The backup API writes every page of the destination under its lock, WAL
                # included: unlike copying the file over, no stale -wal is left to replay.
                backup.backup(out)
                schema = _schema(out)
            finally:
                out.close()
        finally:
            backup.close()
    except sqlite3.Error as exc:
        raise StoreError(f"restoring {copy} into {db} failed: {exc}") from None
    return schema


def _check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    result = conn.execute("PRAGMA quick_check").fetchone()[0]
    if result != "ok":
        raise StoreError(
            f"{path} failed SQLite's integrity check: {result}",
            hint="take the backup again; a damaged copy is never restored",
            code="backup_corrupt",
        )


# -- blobs --------------------------------------------------------------------------------------


def copy_blobs(src: Path, dest: Path) -> tuple[int, int]:
    """Copy every blob under ``src`` that ``dest`` lacks, verified; returns (count, bytes).

    Only finished blobs are copied (``ab/abcdef…``): an upload's temp file is not one yet.
    """
    count = size = 0
    if not src.is_dir():
        return 0, 0
    for shard in sorted(src.iterdir()):
        if not shard.is_dir() or len(shard.name) != 2:
            continue
        for blob in sorted(shard.iterdir()):
            if not SHA256_RE.match(blob.name) or blob.name[:2] != shard.name:
                continue
            target = dest / shard.name / blob.name
            if target.exists():
                continue  # content-addressed: the same name holds the same bytes
            size += _copy_verified(blob, target)
            count += 1
    return count, size


def _copy_verified(blob: Path, target: Path) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, blob.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != blob.name:
            raise StoreError(
                f"the blob {blob} does not match its name (damaged on disk)",
                hint="it was not copied; jobs that name it will report it missing",
                details={"path": str(blob)},
                code="blob_corrupt",
            )
        os.replace(tmp, target)
        return target.stat().st_size
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# -- the two operations -------------------------------------------------------------------------


async def take_backup(
    url: str, artifacts: Path | None, dest: Path, *, home: Path | None = None
) -> BackupReport:
    """Back up the store at ``url`` and the blobs in ``artifacts`` (None: none) to ``dest``;
    ``home``: the SQLite home the store lives in (a restore as the original checks its lock)."""
    import asyncio

    started = time.monotonic()
    new_backup_folder(dest)
    if is_postgres(url):
        from .backup_pg import backup_postgres

        kind, schema = "postgresql", await backup_postgres(url, dest)
    else:
        kind = "sqlite"
        schema = await asyncio.to_thread(backup_sqlite, sqlite_path(url), dest)
    blobs, size = 0, 0
    if artifacts is not None:
        blobs, size = await asyncio.to_thread(copy_blobs, artifacts, dest / BLOBS)
    where: dict[str, Any] = {"source": without_password(url) if kind == "postgresql" else url}
    where["place"] = place(url)
    if home is not None:
        where["home"] = str(home.resolve())
    where["cluster_id"] = await cluster_id_of(url)
    write_manifest(dest, kind=kind, schema=schema, blobs=blobs, blob_bytes=size, **where)
    return BackupReport(dest, kind, schema, blobs, size, time.monotonic() - started)


async def restore_backup(
    src: Path,
    url: str,
    artifacts: Path | None,
    *,
    force: bool = False,
    as_original: bool = False,
    original: str | None = None,
) -> BackupReport:
    """Restore the backup in ``src`` into the store at ``url`` and the blob folder ``artifacts``.

    Blobs are restored after the database: a refused or failed database restore copies none.
    Into another place than the backup's, the database becomes a copy with a cluster id of its
    own, unless ``as_original`` (refused while the original still leads; ``original``: its URL,
    when the backup's, kept without a password, cannot reach it).
    """
    import asyncio

    started = time.monotonic()
    manifest = read_manifest(src)
    kind = "postgresql" if is_postgres(url) else "sqlite"
    if manifest.get("kind") != kind:
        raise InvalidInput(
            f"the backup {src} is of a {manifest.get('kind')} store, and {shown(url)} is {kind}",
            hint="restore into a store of the same kind (--home or --db sqlite:///PATH for "
            "SQLite, --db postgresql://… for PostgreSQL)",
            details={"backup": manifest.get("kind"), "target": kind},
            code="backup_kind",
        )
    same = manifest.get("place") == place(url)
    note = ""
    if as_original and not same:
        note = await check_original(manifest, original)  # refuses while it still leads
    await check_target(url)
    if kind == "postgresql":
        from .backup_pg import restore_postgres

        await restore_postgres(src, url, force=force)
    else:
        await asyncio.to_thread(_restore_sqlite_or_undo, src, sqlite_path(url), force)
    kept = manifest.get("cluster_id")
    if same or as_original:
        cluster = ClusterOutcome(False, kept, kept, note=note)
    else:
        old, new, ended = await make_copy(url)
        cluster = ClusterOutcome(True, new, old or kept, ended)
    blobs, size = 0, 0
    if artifacts is not None:
        blobs, size = await asyncio.to_thread(copy_blobs, src / BLOBS, artifacts)
    schema = int(manifest.get("schema", 0))
    seconds = time.monotonic() - started
    return BackupReport(src, kind, schema, blobs, size, seconds, cluster)


def _restore_sqlite_or_undo(src: Path, db: Path, force: bool) -> int:
    """``restore_sqlite``, removing the file and folders it made when it is refused or fails."""
    made = [p for p in (db, *db.parents) if not p.exists()]
    try:
        return restore_sqlite(src, db, force=force)
    except BaseException:
        for path in made:  # the file first, then its folders, innermost first
            with contextlib.suppress(OSError):
                path.unlink() if path == db else path.rmdir()
        for extra in ("-wal", "-shm", "-journal"):
            if db in made:
                with contextlib.suppress(OSError):
                    Path(f"{db}{extra}").unlink()
        raise
