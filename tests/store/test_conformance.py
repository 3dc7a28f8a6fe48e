"""The MetadataStore conformance suite (conformance.py, conformance_writes.py), run against every
store URL scheme.

SQLite (a file, and in memory) and PostgreSQL (a scratch database per test on the session's real
server, ``gl_postgres``; its schema hooks read and write the migrations table with ``psql``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpulayer_kernel.store import LATEST_SCHEMA
from gpulayer_kernel.testing.postgres import PostgresServer

from .conformance import Backend, StoreConformance
from .conformance_audit import AuditConformance
from .conformance_idempotency import IdempotencyConformance
from .conformance_writes import WriteConformance


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite://")


def _read_sqlite_schema(url: str) -> int:
    con = sqlite3.connect(_sqlite_path(url))
    try:
        return int(con.execute("PRAGMA user_version").fetchone()[0])
    finally:
        con.close()


def _write_sqlite_schema(url: str, version: int) -> None:
    con = sqlite3.connect(_sqlite_path(url))
    try:
        con.execute(f"PRAGMA user_version = {version}")
        con.commit()
    finally:
        con.close()


BACKENDS = [
    Backend(
        "sqlite-file",
        url=lambda folder: f"sqlite://{folder / 'gpulayer.db'}",
        latest_schema=LATEST_SCHEMA,
        read_schema=_read_sqlite_schema,
        write_schema=_write_sqlite_schema,
    ),
    Backend(
        "sqlite-memory",
        url=lambda _folder: "sqlite:///:memory:",
        latest_schema=LATEST_SCHEMA,
        durable=False,
    ),
]


def postgres_backend(pg: PostgresServer) -> Backend:
    def database(url: str) -> str:
        return url.rsplit("/", 1)[1]

    def read(url: str) -> int:
        return int(pg.sql("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", database(url)))

    def write(url: str, version: int) -> None:
        pg.sql(
            f"INSERT INTO schema_migrations VALUES ({version}, 'from the future', 0)", database(url)
        )

    def fresh(_folder: Path) -> str:
        return pg.create_database()

    return Backend(
        "postgresql", url=fresh, latest_schema=LATEST_SCHEMA, read_schema=read, write_schema=write
    )


@pytest.fixture(params=[*(b.name for b in BACKENDS), "postgresql"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "postgresql":
        return postgres_backend(request.getfixturevalue("gl_postgres"))
    return next(b for b in BACKENDS if b.name == request.param)


class TestMetadataStore(
    StoreConformance, WriteConformance, IdempotencyConformance, AuditConformance
):
    pass
