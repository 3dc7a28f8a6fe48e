"""``gpulayer db backup`` / ``restore``: a copy taken beside a running server restores whole, on
SQLite and on a real PostgreSQL; a restore never overwrites data unasked; bad backups refused."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec
from gpulayer_kernel.errors import Conflict, InvalidInput, SchemaTooNew, StoreError
from gpulayer_kernel.store import JobQuery, open_store
from gpulayer_kernel.store.artifacts import LocalArtifactStore
from gpulayer_kernel.store.backup import MANIFEST, restore_backup, take_backup
from gpulayer_kernel.store.sqlite import LATEST_SCHEMA, SqliteStore
from gpulayer_kernel.testing.postgres import PostgresServer
from gpulayer_kernel.testing.processes import GL, ServeProcess

from .conformance import job


def gl(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(home)
    return subprocess.run([*GL, *argv], env=env, capture_output=True, text=True, timeout=120)


def spec(i: int) -> JobSpec:
    return JobSpec(name=f"backed-{i}", workload=CommandWorkload(argv=["true"]))


async def _store_with(path: Path, jobs: int) -> None:
    store = SqliteStore(path)
    await store.open()
    try:
        await store.save_jobs([job(i) for i in range(1, jobs + 1)])
    finally:
        await store.close()


async def _job_count(url: str) -> int:
    store = open_store(url)
    await store.open()
    try:
        return len(await store.list_jobs(JobQuery(limit=1000)))
    finally:
        await store.close()


@pytest.mark.slow
def test_a_backup_taken_while_the_server_writes_restores_jobs_tokens_and_blobs(
    tmp_path: Path,
) -> None:
    with ServeProcess(tmp_path / "a") as server, server.client() as client:
        for i in range(3):
            client.submit(spec(i))  # no worker: they stay queued, in the database
        digest = client.put_bundle(b"a blob the backup must carry")
        stop = threading.Event()
        written = [0]

        def keep_writing() -> None:  # the server commits while the backup reads
            with server.client() as c:
                while not stop.is_set() and written[0] < 300:  # all fit one listing
                    c.submit(spec(100 + written[0]))
                    written[0] += 1

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            done = gl("db", "backup", str(tmp_path / "bk"), home=server.home)
        finally:
            stop.set()
            writer.join()
        assert done.returncode == 0, done.stderr
        # The home is locked by the running server: a restore into it is refused.
        busy = gl("db", "restore", str(tmp_path / "bk"), "--force", home=server.home)
        assert busy.returncode == 2 and "in use by another GPUlayer" in busy.stderr
        token = server.admin_token
    manifest = json.loads((tmp_path / "bk" / MANIFEST).read_text())
    assert manifest["kind"] == "sqlite" and manifest["schema"] == LATEST_SCHEMA
    assert manifest["blobs"] >= 1
    assert oct((tmp_path / "bk").stat().st_mode & 0o777) == "0o700"

    restored = gl("db", "restore", str(tmp_path / "bk"), home=tmp_path / "b")
    assert restored.returncode == 0, restored.stderr
    with ServeProcess(tmp_path / "b") as again:
        again.admin_token = token  # tokens came back with the database
        with again.client() as c:
            names = {j.spec.name for j in c.list(limit=1000)}
            assert {"backed-0", "backed-1", "backed-2"} <= names
            # One snapshot: whatever the writer had committed by then, and nothing torn.
            assert 3 <= len(names) <= 3 + written[0]
            assert c.get_bundle(digest) == b"a blob the backup must carry"


async def test_a_restore_into_a_database_with_data_is_refused_unless_forced(
    tmp_path: Path,
) -> None:
    await _store_with(tmp_path / "src.db", jobs=4)
    blobs = LocalArtifactStore(tmp_path / "src-blobs")
    digest = blobs.put(b"x" * 1000)
    report = await take_backup(f"sqlite://{tmp_path}/src.db", blobs.root, tmp_path / "bk")
    assert (report.kind, report.schema, report.blobs) == ("sqlite", LATEST_SCHEMA, 1)

    await _store_with(tmp_path / "dst.db", jobs=1)
    target = f"sqlite://{tmp_path}/dst.db"
    with pytest.raises(Conflict) as info:
        await restore_backup(tmp_path / "bk", target, tmp_path / "dst-blobs")
    assert info.value.code == "restore_not_empty" and "--force" in info.value.hint
    assert info.value.details["rows"]["jobs"] == 1
    assert await _job_count(target) == 1  # untouched
    assert not (tmp_path / "dst-blobs").exists()  # the refused restore copied no blob

    await restore_backup(tmp_path / "bk", target, tmp_path / "dst-blobs", force=True)
    assert await _job_count(target) == 4
    assert LocalArtifactStore(tmp_path / "dst-blobs").get(digest) == b"x" * 1000


async def test_bad_backups_and_targets_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        await take_backup(f"sqlite://{tmp_path}/none.db", None, tmp_path / "b0")
    assert info.value.code == "backup_source"

    await _store_with(tmp_path / "src.db", jobs=1)
    url = f"sqlite://{tmp_path}/src.db"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(InvalidInput) as info:
        await take_backup(url, None, tmp_path / "full")
    assert info.value.code == "backup_exists"

    with pytest.raises(InvalidInput) as info:
        await restore_backup(tmp_path / "full", f"sqlite://{tmp_path}/new.db", None)
    assert info.value.code == "backup_invalid" and MANIFEST in info.value.message

    await take_backup(url, None, tmp_path / "bk")
    with pytest.raises(InvalidInput) as info:
        await restore_backup(tmp_path / "bk", "postgresql://gl@127.0.0.1:1/gl", None)
    assert info.value.code == "backup_kind"

    manifest = tmp_path / "bk" / MANIFEST
    body = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**body, "schema": LATEST_SCHEMA + 1}))
    with pytest.raises(SchemaTooNew) as too_new:
        await restore_backup(tmp_path / "bk", f"sqlite://{tmp_path}/new.db", None)
    assert too_new.value.code == "schema_too_new" and not (tmp_path / "new.db").exists()


async def test_a_damaged_blob_is_never_copied(tmp_path: Path) -> None:
    await _store_with(tmp_path / "src.db", jobs=1)
    blobs = LocalArtifactStore(tmp_path / "blobs")
    digest = blobs.put(b"good bytes")
    (tmp_path / "blobs" / digest[:2] / digest).write_bytes(b"rotten bytes")
    with pytest.raises(StoreError) as info:
        await take_backup(f"sqlite://{tmp_path}/src.db", blobs.root, tmp_path / "bk")
    assert info.value.code == "blob_corrupt" and digest in info.value.message
    assert not (tmp_path / "bk" / "artifacts" / digest[:2] / digest).exists()


@pytest.mark.slow
async def test_postgres_backs_up_with_pg_dump_and_restores_with_pg_restore(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    source = gl_postgres.create_database()
    store = open_store(source)
    await store.open()
    try:
        await store.save_jobs([job(i) for i in range(1, 6)])
    finally:
        await store.close()
    report = await take_backup(source, None, tmp_path / "bk")
    assert (report.kind, report.schema) == ("postgresql", LATEST_SCHEMA)
    assert (tmp_path / "bk" / "gpulayer.pgdump").stat().st_size > 0

    fresh = gl_postgres.create_database()
    await restore_backup(tmp_path / "bk", fresh, None)
    assert await _job_count(fresh) == 5  # and it opens: migrations see schema LATEST

    with pytest.raises(Conflict) as info:
        await restore_backup(tmp_path / "bk", fresh, None)
    assert info.value.code == "restore_not_empty" and info.value.details["rows"]["jobs"] == 5
    await restore_backup(tmp_path / "bk", fresh, None, force=True)
    assert await _job_count(fresh) == 5
