"""The MetadataStore conformance suite (conformance.py), run against every store URL scheme.

A new implementation adds its ``Backend`` to ``BACKENDS`` (the PostgreSQL store: a
``postgresql://`` URL to a scratch database, with schema hooks reading its migrations table).
"""

from __future__ import annotations

import sqlite3

import pytest

from gpulayer_kernel.store import LATEST_SCHEMA

from .conformance import Backend, StoreConformance


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


@pytest.fixture(params=BACKENDS, ids=[b.name for b in BACKENDS])
def backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.param
    return backend


class TestMetadataStore(StoreConformance):
    pass
