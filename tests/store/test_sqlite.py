"""SQLite store: WAL, numbered migrations, refusal of newer schemas, group commit."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    Job,
    JobSpec,
    JobState,
    LogRecord,
    WorkerInfo,
)
from gpulayer_kernel.errors import SchemaTooNew, StoreError
from gpulayer_kernel.store import LATEST_SCHEMA, JobQuery, SqliteStore
from gpulayer_kernel.store.sqlite import MIGRATIONS
from gpulayer_kernel.testing import until


def _job(i: int, state: JobState = JobState.QUEUED, **labels: str) -> Job:
    spec = JobSpec(name=f"j{i}", workload=CommandWorkload(argv=["true"]), labels=labels)
    return Job(id=f"job{i:08d}", seq=i, spec=spec, state=state, submitted_at=time.time())


async def test_wal_mode_and_migrations_are_recorded(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    await store.close()
    con = sqlite3.connect(tmp_path / "db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA user_version").fetchone()[0] == LATEST_SCHEMA
    versions = [r[0] for r in con.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert versions == [number for number, _, _ in MIGRATIONS]
    con.close()


async def test_reopening_applies_nothing_twice(tmp_path: Path) -> None:
    for _ in range(2):
        store = SqliteStore(tmp_path / "db")
        await store.open()
        await store.save_jobs([_job(1)])
        await store.close()
    con = sqlite3.connect(tmp_path / "db")
    assert con.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == len(MIGRATIONS)
    con.close()


async def test_database_from_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE future (x)")
    con.execute(f"PRAGMA user_version = {LATEST_SCHEMA + 7}")
    con.commit()
    con.close()
    before = path.read_bytes()
    store = SqliteStore(path)
    with pytest.raises(SchemaTooNew) as info:
        await store.open()
    assert f"schema version {LATEST_SCHEMA + 7}" in info.value.message
    assert "upgrade" in info.value.hint
    assert path.read_bytes() == before


async def test_jobs_round_trip_and_filters(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    await store.save_jobs([_job(1), _job(2, JobState.SUCCEEDED, team="vision"), _job(3)])
    await store.save_jobs([_job(3, JobState.RUNNING)])  # upsert
    assert (await store.get_job("job00000003")).state == JobState.RUNNING  # type: ignore[union-attr]
    assert await store.get_job("missing") is None
    queued = await store.list_jobs(JobQuery(states=[JobState.QUEUED]))
    assert [j.id for j in queued] == ["job00000001"]
    labelled = await store.list_jobs(JobQuery(label=("team", "vision")))
    assert [j.id for j in labelled] == ["job00000002"]
    newest_first = await store.list_jobs(JobQuery(limit=2))
    assert [j.seq for j in newest_first] == [3, 2]
    assert await store.max_job_seq() == 3
    assert await store.find_job_ids("job0000000") == ["job00000001", "job00000002"]
    assert await store.find_job_ids("job_") == []  # '_' is not a wildcard
    await store.close()


async def test_logs_append_read_and_ignore_duplicates(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    recs = [LogRecord(seq=i, time=float(i), stream="stdout", text=f"line {i}") for i in (1, 2, 3)]
    await store.append_logs("j", recs)
    await store.append_logs("j", recs[:1])  # a resent batch is not duplicated
    assert [r.text for r in await store.read_logs("j", 1, 10)] == ["line 2", "line 3"]
    assert await store.max_log_seq("j") == 3
    assert await store.max_log_seq("other") == 0
    await store.close()


async def test_concurrent_writes_are_group_committed_and_all_kept(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    await asyncio.gather(*(store.save_jobs([_job(i)]) for i in range(1, 301)))
    assert await store.max_job_seq() == 300
    assert len(await store.list_jobs(JobQuery(limit=1000))) == 300
    await store.close()


async def test_a_second_connection_sees_committed_data(tmp_path: Path) -> None:
    # WAL lets a reader (e.g. `gpulayer logs` after the fact) read while a writer is open.
    writer = SqliteStore(tmp_path / "db")
    await writer.open()
    await writer.save_jobs([_job(1)])
    reader = SqliteStore(tmp_path / "db")
    await reader.open()
    assert (await reader.get_job("job00000001")) is not None
    await reader.close()
    await writer.close()


async def test_secrets_are_stored_and_listed_by_name(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    await store.set_secret("HF_TOKEN", "hf_abc")
    assert await store.list_secret_names() == ["HF_TOKEN"]
    assert await store.get_secrets(["HF_TOKEN", "NOPE"]) == {"HF_TOKEN": "hf_abc"}
    assert await store.delete_secret("HF_TOKEN")
    assert not await store.delete_secret("HF_TOKEN")
    await store.close()


async def test_a_stored_worker_record_that_is_no_longer_valid_is_skipped_not_fatal(
    tmp_path: Path,
) -> None:
    # Issue 12 item 1: a worker that joined with a device index of 10**12 before the contracts
    # bounded it must not stop every later start of the control plane.
    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    good = WorkerInfo(id="good", name="good", registered_at=1.0, last_heartbeat=1.0)
    await store.save_workers([good])
    bad = good.model_dump(mode="json") | {"id": "bad", "name": "bad"}
    bad["capabilities"]["devices"] = [
        {"index": 10**12, "vendor": "sim", "name": "x", "kind": "sim", "memory_bytes": 0}
    ]
    await store.close()
    with sqlite3.connect(tmp_path / "db.sqlite") as db:
        db.execute("UPDATE workers SET id = 'bad', body = ? WHERE id = 'good'", (json.dumps(bad),))
    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    await store.save_workers([good])
    assert [w.id for w in await store.load_workers()] == ["good"]
    await store.close()


# -- the connection's own thread (sqlite_thread.py) ----------------------------------------------


async def _until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    await until(check, seconds)


async def test_the_thread_checkpoints_after_many_rows_and_when_quiet_not_inside_commits(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    try:
        # SQLite's own checkpoint would run inside a COMMIT: it is off on the store's connection.
        assert await store._fetchall("PRAGMA wal_autocheckpoint") == [(0,)]
        thread = store.thread
        thread.checkpoint_rows, thread.checkpoint_idle = 100, 60.0
        await asyncio.gather(*(store.save_jobs([_job(i)]) for i in range(1, 151)))
        await _until(lambda: thread.checkpoints == 1)  # 150 rows >= 100: one, after the commit
        thread.checkpoint_idle = 0.05
        await store.save_jobs([_job(151)])  # 1 row: below the count, so when quiet
        await _until(lambda: thread.checkpoints == 2)
        # The pages are in the database file: a reader that ignores the WAL sees every job.
        plain = sqlite3.connect(f"file:{tmp_path / 'db'}?immutable=1", uri=True)
        assert plain.execute("SELECT COUNT(*) FROM jobs").fetchone() == (151,)
        plain.close()
    finally:
        await store.close()


async def test_closing_ends_the_thread_and_later_calls_are_refused_not_left_waiting(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    thread = store.thread
    assert thread._thread.daemon  # a store never closed cannot keep the interpreter alive
    await store.close()
    assert not thread._thread.is_alive()
    with pytest.raises(StoreError, match="closed") as info:
        await thread.call(lambda conn: conn.execute("SELECT 1").fetchall())
    assert info.value.hint
    await thread.stop()  # stopping twice is harmless
    with pytest.raises(StoreError, match="not open"):
        await store.get_job("job00000001")


async def test_a_database_that_cannot_be_opened_is_refused_and_leaves_no_thread(
    tmp_path: Path,
) -> None:
    before = {t for t in threading.enumerate() if t.name == "gpulayer-sqlite"}
    store = SqliteStore(tmp_path)  # a folder, not a file
    with pytest.raises(StoreError) as info:
        await store.open()
    assert str(tmp_path) in info.value.message and info.value.code == "store_error"
    await _until(
        lambda: {t for t in threading.enumerate() if t.name == "gpulayer-sqlite"} <= before
    )
