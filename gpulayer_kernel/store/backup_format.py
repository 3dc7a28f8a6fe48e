"""What a backup folder holds and the refusals both store kinds share (``backup.py`` for SQLite
and the blobs, ``backup_pg.py`` for PostgreSQL): the floor both stand on, so neither imports the
other's module for them."""

from __future__ import annotations

from ..errors import Conflict

MANIFEST = "backup.json"
SQLITE_FILE = "gpulayer.db"
PG_FILE = "gpulayer.pgdump"
BLOBS = "artifacts"
FORMAT = 1  # of backup.json; a reader refuses a format it does not know
# Tables whose rows mean "this database is in use" (each exists from the migration named).
DATA_TABLES = ("jobs", "workers", "tokens", "sessions", "users")


def not_empty(target: str, rows: dict[str, int]) -> Conflict:
    """The refusal of a restore into a database that holds data (``--force`` overrides it)."""
    counts = ", ".join(f"{n} {t}" for t, n in rows.items() if n)
    return Conflict(
        f"the database {target} is not empty ({counts}); a restore would replace it",
        hint="restore into a new database, or add --force to replace this one (stop every "
        "control plane on it first)",
        details={"target": target, "rows": rows},
        code="restore_not_empty",
    )
