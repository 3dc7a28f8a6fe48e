"""open_store: a URL names the metadata store; unknown or malformed URLs get a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer_kernel.errors import InvalidInput
from gpulayer_kernel.store import SqliteStore, open_store
from gpulayer_kernel.store.postgres import PostgresStore


async def test_a_sqlite_url_opens_that_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "gpulayer.db"
    store = open_store(f"sqlite://{path}")
    assert isinstance(store, SqliteStore) and store.path == path
    await store.open()
    await store.close()
    assert path.exists()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_postgresql_url_names_a_postgres_store(scheme: str) -> None:
    store = open_store(f"{scheme}://gl:pw@db.example:5432/gpulayer?sslmode=require")
    assert isinstance(store, PostgresStore) and "pw" not in store.shown_url


def test_sqlite_memory_url() -> None:
    store = open_store("sqlite:///:memory:")
    assert isinstance(store, SqliteStore) and store.path == ":memory:"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://gl:hunter2@/", "names no database"),
        ("mysql://gl:hunter2@db/gl", "supported schemes are sqlite://"),
        ("/home/me/gl.db", "supported schemes are sqlite://"),
        ("sqlite://relative.db", "names a host"),
        ("sqlite:///", "names no file"),
        ("sqlite:///tmp/gl.db?mode=ro", "takes no options"),
    ],
)
def test_other_urls_are_refused_by_name(url: str, words: str) -> None:
    with pytest.raises(InvalidInput) as info:
        open_store(url)
    err = info.value
    assert words in err.message
    assert err.code == "store_url" and "sqlite:///" in err.hint and "postgresql://" in err.hint
    assert "hunter2" not in err.message + str(err.details)  # a password is never echoed
    if "hunter2" not in url:
        assert url in err.message
