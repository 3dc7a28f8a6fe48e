"""``gpulayer db backup|restore|version``: the control plane's state, for its administrator.

These open the store themselves (like ``gpulayer serve``, from ``--home`` / ``--db`` /
``--artifacts``), not through a server's API: a backup must work when no server is up, and
SQLite's backup API reads a consistent snapshot beside a running server (WAL). A restore into
a home's database takes the home's lock, so it is refused while a control plane runs there; a
refused restore leaves no folder or lock file it made. A restore into another place than the
backup's makes a copy with a cluster id of its own (its servers never touch the original's
machines) unless ``--as-original``, refused while the original still leads.
The work lives in ``store/backup.py``; this module parses and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from .common import Handler


def add_parsers(sub: Any) -> None:
    """Add db and its actions to the ``gpulayer`` sub-parsers."""
    db = sub.add_parser("db", help="back up, restore and inspect the control plane's database")
    dsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    backup = dsub.add_parser(
        "backup", help="copy the database and blobs into a new folder PATH (server may run)"
    )
    backup.add_argument("path", metavar="PATH", help="a new (or empty) folder")
    backup.add_argument(
        "--no-artifacts", action="store_true", help="the database only, not the blobs"
    )
    restore = dsub.add_parser(
        "restore", help="restore a backup folder PATH (every server on the target stopped)"
    )
    restore.add_argument("path", metavar="PATH", help="a folder `gpulayer db backup` made")
    restore.add_argument("--force", action="store_true", help="replace a database that holds data")
    restore.add_argument(
        "--as-original",
        action="store_true",
        help="the restored database replaces the original (keeps its cluster id, so its "
        "servers own the original's machines); refused while the original still leads",
    )
    restore.add_argument(
        "--original",
        default=None,
        metavar="URL",
        help="with --as-original: the original database's URL, when the one the backup "
        "recorded (without its password) cannot reach it",
    )
    version = dsub.add_parser("version", help="the database's schema version and this code's")
    for p in (backup, restore, version):
        p.add_argument("--home", default=None, help="state directory (default $GPULAYER_HOME)")
        p.add_argument(
            "--db",
            default=None,
            metavar="URL",
            help="the store, as `gpulayer serve --db` names it (default: SQLite in the home)",
        )
    for p in (backup, restore):
        p.add_argument(
            "--artifacts",
            default=None,
            metavar="DIR",
            help="the blob folder, as `gpulayer serve --artifacts` (default: in the home)",
        )


def _where(args: argparse.Namespace) -> tuple[str, Any]:
    from ..home import Layout, home_dir

    layout = Layout(home_dir(args.home))
    return args.db or f"sqlite://{layout.db}", layout


def _home_exists(args: argparse.Namespace) -> bool:
    """Whether the home folder is there before ``home_dir`` makes it (a refused restore removes
    the one it made)."""
    import os

    from ..home import HOME_ENV

    raw = args.home or os.environ.get(HOME_ENV) or Path.home() / ".gpulayer"
    return Path(raw).expanduser().exists()


async def cmd_db(args: argparse.Namespace) -> int:
    from ..store import backup as b

    home_existed = _home_exists(args)
    url, layout = _where(args)
    if args.db_command == "version":
        return await _version(url)
    artifacts = Path(args.artifacts) if args.artifacts else layout.artifacts
    if args.db_command == "backup":
        home = layout.root if url == f"sqlite://{layout.db}" else None
        report = await b.take_backup(
            url, None if args.no_artifacts else artifacts, Path(args.path), home=home
        )
        verb = "backed up"
    else:
        report = await _restore(args, url, layout, artifacts, home_existed)
        verb = "restored"
    print(
        f"{verb} {report.kind} database (schema {report.schema}) and {report.blobs} blob(s), "
        f"{report.blob_bytes / 1e6:.1f} MB, in {report.seconds:.1f}s: {report.path}",
        file=sys.stderr,
    )
    if report.cluster is not None:
        _say_cluster(report.cluster)
    if verb == "restored":
        print(
            "start `gpulayer serve` on it: it migrates an older schema to this version",
            file=sys.stderr,
        )
    return 0


async def _restore(
    args: argparse.Namespace, url: str, layout: Any, artifacts: Path, home_existed: bool
) -> Any:
    """The restore, under the home's lock when it restores the home's own database (refuses a
    running control plane there, and keeps one from starting on a half-restored database).
    What this command made (the home folder, its lock file) goes again if it is refused."""
    from ..home import StateLock
    from ..store import backup as b

    lock: StateLock | None = None
    made = [] if home_existed else [layout.root]
    made += [layout.lock] if not layout.lock.exists() else []
    try:
        if url == f"sqlite://{layout.db}":
            layout.root.mkdir(parents=True, exist_ok=True)
            lock = StateLock(layout)
            lock.acquire()
        return await b.restore_backup(
            Path(args.path),
            url,
            artifacts,
            force=args.force,
            as_original=args.as_original,
            original=args.original,
        )
    except BaseException:
        if lock is not None:
            lock.release()
            lock = None
        for path in reversed(made):  # the lock file, then the folder (if still empty)
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        raise
    finally:
        if lock is not None:
            lock.release()


def _say_cluster(c: Any) -> None:
    if c.copy:
        left = (
            f"; {c.left_running} machine(s) it recorded as live were left to it"
            if (c.left_running)
            else ""
        )
        print(
            f"restored as a copy: new cluster id {c.cluster_id} (the original's: "
            f"{c.original or 'none yet'}); its servers never touch the original's machines"
            f"{left}. Restoring the original? add --as-original",
            file=sys.stderr,
        )
    elif c.original:
        print(f"cluster id kept: {c.original}", file=sys.stderr)
    if c.note:
        print(f"note: {c.note}", file=sys.stderr)


async def _version(url: str) -> int:
    from ..store import backup as b
    from ..store.sqlite import LATEST_SCHEMA

    if b.is_postgres(url):
        from ..store.backup_pg import schema_and_rows

        schema, _ = await schema_and_rows(url)
    else:
        schema = b.sqlite_schema(b.sqlite_path(url))
    state = (
        "up to date"
        if schema == LATEST_SCHEMA
        else "newer than this GPUlayer: upgrade it"
        if schema > LATEST_SCHEMA
        else "older: `gpulayer serve` migrates it on start (back it up first)"
    )
    print(f"database schema {schema}, this GPUlayer {LATEST_SCHEMA}: {state}")
    return 0


COMMANDS: dict[str, Handler] = {"db": cmd_db}
