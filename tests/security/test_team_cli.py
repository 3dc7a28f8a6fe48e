"""A team on one served control plane, through the real CLI: users, tokens per user, secrets
sealed in the database, key rotation, and a missing or wrong key refusing the start."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.contracts import CommandWorkload, JobSpec
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.testing import GL, ServeProcess

pytestmark = pytest.mark.slow


def gl(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GL, *args], capture_output=True, text=True, timeout=60, env=env, input=stdin
    )


def test_a_team_shares_one_server_safely(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with ServeProcess(home) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        env |= {"GPULAYER_HOME": str(tmp_path / "nowhere"), **server.client_env()}
        assert gl(env, "user", "add", "alice").returncode == 0
        made = gl(env, "token", "create", "--user", "alice", "--name", "laptop")
        assert made.returncode == 0, made.stderr
        alice = made.stdout.strip()
        listed = gl(env, "user", "list").stdout
        assert "alice" in listed and "admin" in listed
        spec = JobSpec(name="admins", workload=CommandWorkload(argv=["true"]))
        with server.client() as admin, Client(server.url, alice) as mine:
            theirs = admin.submit(spec)
            assert mine.list() == []
            with pytest.raises(GPUlayerError) as info:
                mine.cancel(theirs.id)
            assert info.value.code == "not_yours"
            with pytest.raises(GPUlayerError) as info:
                mine.create_token("join")
            assert info.value.code == "role_forbidden"
        secret = "hf_" + "s3cr3t" * 4
        alice_env = {**env, "GPULAYER_TOKEN": alice}
        assert gl(alice_env, "secret", "set", "HF_TOKEN", stdin=secret).returncode == 0
        assert gl(alice_env, "secret", "list").stdout.split() == ["HF_TOKEN"]
        assert gl(env, "secret", "list").stdout.split() == []  # the admin's own: none
        rotated = gl(env, "secret", "rotate-key")
        assert rotated.returncode == 0 and "sealed with key" in rotated.stderr
        refused = gl(alice_env, "secret", "rotate-key")
        assert refused.returncode == 2 and "admin role" in refused.stderr
    db = sqlite3.connect(home / "gpulayer.db")
    values = [r[0] for r in db.execute("SELECT value FROM user_secrets")]
    db.close()
    assert len(values) == 1 and values[0].startswith("gv1:") and secret not in values[0]
    assert secret.encode() not in (home / "gpulayer.db").read_bytes()
    # Without its key the server refuses to start, and says why.
    key = home / "secrets.key"
    saved = key.read_bytes()
    key.unlink()
    with pytest.raises(RuntimeError) as start:
        ServeProcess(home).start()
    assert "secrets.key is missing" in str(start.value) and "1 secret(s)" in str(start.value)
    key.write_bytes(b"A" * 43 + b"=\n")  # a well-formed key, but not the one
    # Readable by others first (0644: it opens every secret): refused, saying so (issue 32).
    key.chmod(0o644)
    with pytest.raises(RuntimeError) as start:
        ServeProcess(home).start()
    assert "has mode 0644" in str(start.value) and "chmod 600" in str(start.value)
    key.chmod(0o600)
    with pytest.raises(RuntimeError) as start:
        ServeProcess(home).start()
    assert "was sealed with key" in str(start.value)
    key.write_bytes(saved)
    with ServeProcess(home):
        pass  # the right key again: it starts
