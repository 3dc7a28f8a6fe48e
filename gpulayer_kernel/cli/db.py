"""``gpulayer db backup|restore|version``: the control plane's state, for its administrator.

These open the store themselves (like ``gpulayer serve``, from ``--home`` / ``--db`` /
``--artifacts``), not through a server's API: a backup must work when no server is up, and
SQLite's backup API reads a consistent snapshot beside a running server (WAL). A restore into
a home takes the home's lock, so it is refused while a control plane runs there.
The work lives in ``store/backup.py``; this module parses and prints.
"""

from __future__ import annotations

import argparse
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


async def cmd_db(args: argparse.Namespace) -> int:
    from ..store import backup as b

    url, layout = _where(args)
    if args.db_command == "version":
        return await _version(url)
    artifacts = Path(args.artifacts) if args.artifacts else layout.artifacts
    if args.db_command == "backup":
        report = await b.take_backup(url, None if args.no_artifacts else artifacts, Path(args.path))
        verb = "backed up"
    else:
        from ..home import StateLock

        lock = StateLock(layout)
        # Held through the restore: refuses a running control plane in this home, and keeps
        # one from starting on a half-restored database.
        lock.acquire()
        try:
            report = await b.restore_backup(Path(args.path), url, artifacts, force=args.force)
        finally:
            lock.release()
        verb = "restored"
    print(
        f"{verb} {report.kind} database (schema {report.schema}) and {report.blobs} blob(s), "
        f"{report.blob_bytes / 1e6:.1f} MB, in {report.seconds:.1f}s: {report.path}",
        file=sys.stderr,
    )
    if verb == "restored":
        print(
            "start `gpulayer serve` on it: it migrates an older schema to this version",
            file=sys.stderr,
        )
    return 0


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
