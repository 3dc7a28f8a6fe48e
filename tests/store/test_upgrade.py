"""Upgrades: today's code on a home written at store schema 5 (before issue 23) migrates it and
keeps every job, log, user, token, secret and session; a schema newer than the code is refused
and the file left untouched.

The fixture (``data/schema5-home.tar.gz``) was written by the schema-5 code itself, serving real
jobs and a session; ``data/make_schema5.py`` says how.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpulayer_kernel.errors import SchemaTooNew
from gpulayer_kernel.store import JobQuery
from gpulayer_kernel.store.sqlite import LATEST_SCHEMA, MIGRATIONS, SqliteStore
from gpulayer_kernel.testing.processes import GL, ServeProcess

FIXTURE = Path(__file__).parent / "data" / "schema5-home.tar.gz"
OLD_JOBS = {"old-0", "old-1", "old-2", "old-fails", "old-queued", "old-session"}


def old_home(root: Path) -> Path:
    home = root / "home"
    home.mkdir(mode=0o700)
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(home, filter="data")
    assert schema_of(home / "gpulayer.db") == 5
    return home


def schema_of(db: Path) -> int:
    # Closed at once: the last connection to close folds the WAL into the file, so the file's
    # bytes say everything (an open one would leave writes in the -wal for the next to fold).
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def gl(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(home)
    return subprocess.run([*GL, *argv], env=env, capture_output=True, text=True, timeout=120)


async def test_migrations_after_5_run_on_the_old_store_and_keep_its_data(tmp_path: Path) -> None:
    home = old_home(tmp_path)
    store = SqliteStore(home / "gpulayer.db")
    await store.open()  # runs 6 .. LATEST
    try:
        jobs = {j.spec.name: j for j in await store.list_jobs(JobQuery(limit=100))}
        assert set(jobs) == OLD_JOBS
        assert jobs["old-0"].state == "succeeded" and jobs["old-fails"].state == "failed"
        texts = [r.text for r in await store.read_logs(jobs["old-1"].id, since=0, limit=100)]
        assert "line one of 1" in texts and "line two of 1" in texts
        assert {u.name for u in await store.list_users()} >= {"admin", "alice"}
        tokens = await store.list_tokens()
        assert {t.kind for t in tokens} >= {"client", "join"} and len(tokens) == 4
        assert await store.list_secret_names() == ["HF_TOKEN"]
        session_job = jobs["old-session"]
        cells = await store.list_cells(session_job.id)
        assert [c.number for c in cells] == [1]
    finally:
        await store.close()
    db = sqlite3.connect(home / "gpulayer.db")
    applied = [row[0] for row in db.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert applied == [number for number, _, _ in MIGRATIONS]
    assert db.execute("PRAGMA user_version").fetchone()[0] == LATEST_SCHEMA


@pytest.mark.slow
def test_todays_server_serves_the_old_home_with_its_old_token(tmp_path: Path) -> None:
    home = old_home(tmp_path)
    before = gl("db", "version", home=home)
    assert before.returncode == 0 and f"database schema 5, this GPUlayer {LATEST_SCHEMA}" in (
        before.stdout
    )
    with ServeProcess(home) as server:
        server.admin_token = (home / "admin.token").read_text().strip()
        with server.client() as c:
            assert {j.spec.name for j in c.list(limit=100)} == OLD_JOBS
            old = next(j for j in c.list(limit=100) if j.spec.name == "old-2")
            assert "line two of 2" in [r.text for r in c.logs(old.id).records]
            # The secret sealed by the old code opens with the old key file.
            assert c.secret_names() == ["HF_TOKEN"]
    after = gl("db", "version", home=home)
    assert "up to date" in after.stdout


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
async def test_a_schema_newer_than_the_code_is_refused_and_left_untouched(
    tmp_path: Path,
) -> None:
    home = old_home(tmp_path)
    db = home / "gpulayer.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST_SCHEMA + 1}")
    assert not db.with_name("gpulayer.db-wal").exists()  # folded in: the bytes say it all
    digest = hashlib.sha256(db.read_bytes()).hexdigest()

    store = SqliteStore(db)
    with pytest.raises(SchemaTooNew) as info:
        await store.open()
    err = info.value
    assert err.code == "schema_too_new" and err.details["schema"] == LATEST_SCHEMA + 1
    assert "upgrade GPUlayer" in err.hint
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest

    served = gl("serve", "--port", "0", home=home)  # exits at once, status 2, message and hint
    assert served.returncode == 2 and "newer than the" in served.stderr
    assert "gpulayer: hint: upgrade GPUlayer" in served.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    version = gl("db", "version", home=home)
    assert "newer than this GPUlayer" in version.stdout
