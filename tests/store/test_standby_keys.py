"""A standby checks its secrets key before it is needed, and says its role (real processes on a
real PostgreSQL database).

- a standby whose key file is missing, or holds another key, refuses to stand by (exit 2, the
  key named) instead of taking over later only to exit;
- /health answers 200 ``role: standby`` on the standby and ``role: leader`` on the leader;
  /ready answers 503 ``not_leader`` on the standby and 200 on the leader;
- a one-step rotation on the leader leaves the standby's copy stale: its /health says so
  (``degraded``, ``secrets_key``) and its log too, within seconds; a fresh copy clears it;
- a rotation in three steps with the copy taken after ``add`` never degrades the standby, and
  after a kill -9 of the leader the standby takes over and opens every secret.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.security.vault import KeySource, new_key
from gpulayer_kernel.testing import GL, ServeProcess, wait_until
from gpulayer_kernel.testing.postgres import PostgresServer, free_port

pytestmark = pytest.mark.slow

CHECK = ("--key-check-interval", "0.2")


def gl(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GL, *args], capture_output=True, text=True, timeout=60, env=env, input=stdin
    )


def client_env(server: ServeProcess, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    return env | {"GPULAYER_HOME": str(tmp_path / "nowhere"), **server.client_env()}


def health(url: str, route: str = "health") -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/{route}", timeout=10)
    return r.status_code, r.json()


def serve_args(db: str, tmp_path: Path, key: Path) -> tuple[str, ...]:
    return ("--db", db, "--artifacts", str(tmp_path / "artifacts"), "--secrets-key", str(key),
            *CHECK)  # fmt: skip


def test_a_standby_with_a_missing_or_wrong_key_refuses_to_stand_by(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    db = gl_postgres.create_database()
    with ServeProcess(tmp_path / "a", args=serve_args(db, tmp_path, tmp_path / "a.key")) as a:
        env = client_env(a, tmp_path)
        assert gl(env, "secret", "set", "HF_TOKEN", stdin="hf_value").returncode == 0
        wrong = tmp_path / "wrong.key"
        KeySource("file", str(wrong)).write([new_key()])
        for key, says in ((tmp_path / "missing.key", "is missing"), (wrong, "cannot open key")):
            b = subprocess.run(
                [*GL, "serve", "--home", str(tmp_path / "b"), "--port", "0",
                 *serve_args(db, tmp_path, key)],
                capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip
            assert b.returncode == 2, b.stderr
            assert "refusing to stand by" in b.stderr and says in b.stderr, b.stderr
            assert str(key) in b.stderr and "gpulayer: hint: copy the" in b.stderr
            assert "standby on" not in b.stdout  # it never listened
        assert health(a.url)[1]["role"] == "leader"


def test_health_says_the_role_and_a_stale_key_before_it_is_needed(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    db = gl_postgres.create_database()
    a_key, b_key = tmp_path / "a.key", tmp_path / "b.key"
    with ServeProcess(tmp_path / "a", args=serve_args(db, tmp_path, a_key), standby=True) as a:
        a.wait_leading()
        env = client_env(a, tmp_path)
        assert gl(env, "secret", "set", "HF_TOKEN", stdin="hf_value").returncode == 0
        shutil.copy(a_key, b_key)
        args_b = serve_args(db, tmp_path, b_key)
        with ServeProcess(tmp_path / "b", args=args_b, standby=True) as b:
            status, body = health(b.url)
            assert status == 200 and body["role"] == "standby" and body["status"] == "ok"
            assert body["problem"] is None
            status, body = health(b.url, "ready")
            assert status == 503 and body["code"] == "not_leader"
            assert body["details"]["leader"] == a.url
            assert httpx.get(f"{b.url}/metrics", timeout=10).status_code == 503  # a scrape
            health(b.url)  # one more answer: the probes before it were logged by now
            # A standby's 503 is its normal answer: no ERROR for every probe (issue 32).
            assert not [x for x in b.output().splitlines() if " ERROR " in x], b.output()
            assert health(a.url)[1]["role"] == "leader"
            assert health(a.url, "ready") == (200, {"api_version": "gpulayer/v1",
                                                    "status": "ok", "role": "leader"})  # fmt: skip

            held = health(a.url)[1]["keys"]
            assert len(held) == 1 and health(b.url)[1]["keys"] == held  # each says its own

            # A one-step rotation would seal with a key no standby holds yet: refused now.
            rotated = gl(env, "secret", "rotate-key")
            assert rotated.returncode != 0, rotated.stderr
            assert "standby_lacks_key" in rotated.stderr or "no standby holds" in rotated.stderr
            assert "--step add" in rotated.stderr and health(a.url)[1]["keys"] == held

            # A stale copy (another key in b's file): it says so at once, in /health and log.
            KeySource("file", str(b_key)).write([new_key()])
            wait_until(lambda: health(b.url)[1]["status"] == "degraded", timeout=20,
                       what="the standby notices its key is wrong")  # fmt: skip
            problem = health(b.url)[1]["problem"]
            sealing = held[0]
            assert problem["code"] == "secrets_key"
            assert f"cannot open key {sealing}" in problem["message"]
            assert health(b.url)[0] == 200  # alive: a healthcheck must not restart it
            wait_until(lambda: f"cannot open key {sealing}" in b.output(), timeout=10,
                       what="the standby's log")  # fmt: skip
            shutil.copy(a_key, b_key)
            wait_until(lambda: health(b.url)[1]["status"] == "ok", timeout=20, what="fixed")

            # Three steps. After add, b's /health shows it lacks the new key, and the reseal
            # is refused naming b until the file is copied (it said `ok` either way before).
            added = gl(env, "secret", "rotate-key", "--step", "add")
            assert added.returncode == 0 and "step 1 of 3" in added.stderr, added.stderr
            key = added.stderr.split("--key ")[1].split()[0]
            assert health(a.url)[1]["keys"] == [*held, key]
            time.sleep(0.5)  # a few of the standby's checks (every 0.2 s)
            assert key not in health(b.url)[1]["keys"]
            early = gl(env, "secret", "rotate-key", "--step", "reseal", "--key", key)
            assert early.returncode != 0 and f"does not hold key {key}" in early.stderr
            assert b.url in early.stderr and "copy" in early.stderr, early.stderr
            shutil.copy(a_key, b_key)
            wait_until(lambda: key in health(b.url)[1]["keys"], timeout=20, what="b has the key")
            new = held[0]
            for step in (("--step", "reseal", "--key", key), ("--step", "retire")):
                done = gl(env, "secret", "rotate-key", *step)
                assert done.returncode == 0, done.stderr
                for _ in range(3):  # over a few of the standby's checks (every 0.2 s)
                    assert health(b.url)[1]["status"] == "ok"
                    time.sleep(0.3)
            assert f"keys retired: {new}" in done.stderr
            assert health(a.url)[1]["keys"] == [key]

            a.kill()  # SIGKILL: the standby takes over and opens every secret with its copy
            b.wait_leading(30)
            assert health(b.url)[1]["role"] == "leader"
            listed = gl({**env, "GPULAYER_URL": f"{a.url},{b.url}"}, "secret", "list")
            assert listed.stdout.split() == ["HF_TOKEN"], listed.stderr


def test_a_standby_that_cannot_reach_the_database_says_so(tmp_path: Path) -> None:
    pytest.importorskip("asyncpg")
    db = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nobody listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    r = subprocess.run(
        [*GL, "serve", "--home", str(tmp_path / "b"), "--port", "0",
         *serve_args(db, tmp_path, tmp_path / "b.key")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "cannot reach the database" in r.stderr and "Traceback" not in r.stderr
    assert "password" not in r.stderr


def test_a_degraded_standby_does_not_take_the_lock(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    """Issue 32, item 6: a standby whose key went stale took the lock when the leader died, then
    exited, leaving no leader. It must not compete until its key is right again."""
    db = gl_postgres.create_database()
    a_key, b_key = tmp_path / "a.key", tmp_path / "b.key"
    with ServeProcess(tmp_path / "a", args=serve_args(db, tmp_path, a_key), standby=True) as a:
        a.wait_leading()
        env = client_env(a, tmp_path)
        assert gl(env, "secret", "set", "HF_TOKEN", stdin="hf_value").returncode == 0
        shutil.copy(a_key, b_key)
        with ServeProcess(tmp_path / "b", args=serve_args(db, tmp_path, b_key), standby=True) as b:
            KeySource("file", str(b_key)).write([new_key()])  # its copy goes stale
            wait_until(lambda: health(b.url)[1]["status"] == "degraded", timeout=20,
                       what="the standby to notice")  # fmt: skip
            wait_until(lambda: "not competing for the leadership" in b.output(), timeout=10,
                       what="the standby to withdraw")  # fmt: skip
            a.kill()  # the leader dies while the standby's key is wrong
            time.sleep(3.0)  # what the old code did took ~1 s: take the lock, exit
            assert b.alive(), b.output()[-2000:]
            assert "ready on" not in b.output()  # it did not take over
            assert health(b.url)[1]["role"] == "standby"
            shutil.copy(a_key, b_key)  # the key is right again: it competes, and leads
            b.wait_leading(30)
            listed = gl({**env, "GPULAYER_URL": b.url}, "secret", "list")
            assert listed.stdout.split() == ["HF_TOKEN"], listed.stderr
