"""What only the PostgreSQL store has to show: bad URLs at start, the server going away and coming
back, fencing, and two control planes migrating one database at once (against a real server)."""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.errors import StoreError, Unavailable
from gpulayer_kernel.store import JobQuery, open_store
from gpulayer_kernel.store.postgres import PostgresStore, numbered, pg_ddl
from gpulayer_kernel.store.sqlite import MIGRATIONS
from gpulayer_kernel.testing.postgres import PostgresServer, free_port

from .conformance import job


def test_placeholders_and_types_are_translated() -> None:
    assert numbered("SELECT ? FROM t WHERE a = ? AND b IN (?, ?)") == (
        "SELECT $1 FROM t WHERE a = $2 AND b IN ($3, $4)"
    )
    ddl = pg_ddl("CREATE TABLE x (a INTEGER, b REAL, c TEXT) WITHOUT ROWID")
    assert ddl.strip() == "CREATE TABLE x (a BIGINT, b DOUBLE PRECISION, c TEXT)"


async def test_a_missing_database_is_refused_at_open(gl_postgres: PostgresServer) -> None:
    store = open_store(gl_postgres.url("no_such_database"))
    with pytest.raises(StoreError) as info:
        await store.open()
    assert info.value.code == "store_missing" and "createdb" in info.value.hint


async def test_an_unreachable_server_is_refused_at_open_quickly() -> None:
    store = open_store(f"postgresql://gl:secret-pw@127.0.0.1:{free_port()}/gl")
    with pytest.raises(Unavailable) as info:
        await asyncio.wait_for(store.open(), 15)
    err = info.value
    assert err.code == "store_unavailable" and "127.0.0.1" in err.message
    assert "secret-pw" not in err.message + str(err.details) and err.hint


async def test_the_server_going_away_fails_calls_with_503_then_they_recover(
    gl_postgres: PostgresServer,
) -> None:
    store = open_store(gl_postgres.create_database())
    await store.open()
    try:
        await store.save_jobs([job(1)])
        gl_postgres.stop()
        for call in (store.save_jobs([job(2)]), store.get_job("job00000001")):
            with pytest.raises(Unavailable) as info:
                await call
            assert info.value.status == 503 and info.value.code == "store_unavailable"
            assert "retry" in info.value.hint
        gl_postgres.start()
        # The pool reconnects on its own: no reopen, no restart.
        await store.save_jobs([job(3, JobState.RUNNING)])
        assert [j.seq for j in await store.list_jobs(JobQuery())] == [3, 1]  # 2 was refused
    finally:
        if not (gl_postgres.data / "postmaster.pid").exists():
            gl_postgres.start()
        await store.close()


async def test_a_fence_that_refuses_stops_the_whole_transaction(
    gl_postgres: PostgresServer,
) -> None:
    store = open_store(gl_postgres.create_database())
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        calls = 0

        async def fence(con: object) -> None:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise Unavailable("not the leader any more", code="not_leader")

        store.fence = fence
        await store.save_jobs([job(1)])
        with pytest.raises(Unavailable) as info:
            await asyncio.gather(store.save_jobs([job(2)]), store.append_logs("x", []))
        assert info.value.code == "not_leader"
        assert await store.max_job_seq() == 1
    finally:
        await store.close()


async def test_two_control_planes_opening_one_database_migrate_it_once(
    gl_postgres: PostgresServer,
) -> None:
    url = gl_postgres.create_database()
    stores = [open_store(url) for _ in range(3)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        rows = gl_postgres.sql(
            "SELECT version FROM schema_migrations ORDER BY 1", url.rsplit("/")[-1]
        )
        assert [int(v) for v in rows.split()] == [number for number, _, _ in MIGRATIONS]
    finally:
        for s in stores:
            await s.close()
