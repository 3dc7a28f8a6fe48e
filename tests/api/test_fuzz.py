"""Schemathesis against openapi.json: generated requests to every operation find no 5xx."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel.testing import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # hypothesis over every route
ST = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")


def fuzz(schema: Path, base: str, token: str, *select: str, cwd: Path) -> None:
    r = subprocess.run(
        [
            ST,
            "run",
            str(schema),
            "--url",
            base,
            "-H",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "15",
            "--phases",
            "examples,coverage,fuzzing",
            "--generation-database",
            "none",
            "--seed",
            "20261129",
            "--no-color",
            *select,
        ],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout.split("Test cases:")[-1]


def test_no_request_makes_a_5xx(tmp_path: Path) -> None:
    if not Path(ST).exists():
        pytest.skip("schemathesis is not installed")
    # Long-polls are capped at 50 ms here so generated `wait=` values stay quick.
    with ServeProcess(tmp_path / "home", args=("--max-wait", "0.05")) as server:
        base = server.url + "/api/v1"
        auth = {"Authorization": f"Bearer {server.admin_token}"}
        schema = tmp_path / "openapi.json"
        schema.write_text(httpx.get(base + "/openapi.json", headers=auth).text)
        with server.client() as c:
            _, join = c.create_token("join")
        joined = httpx.post(
            base + "/workers/join",
            json={"name": "fuzz"},
            headers={"Authorization": f"Bearer {join}"},
        ).json()
        session = joined["session_token"]
        fuzz(schema, base, server.admin_token, "--include-tag", "user", cwd=tmp_path)
        fuzz(
            schema,
            base,
            session,
            "--include-tag",
            "worker",
            "--exclude-operation-id",
            "post_JoinHandler",
            "--exclude-operation-id",
            "post_LeaveHandler",
            cwd=tmp_path,
        )
        fuzz(schema, base, join, "--include-operation-id", "post_JoinHandler", cwd=tmp_path)
        log = server.output()
        assert " 500 " not in log and "unexpected error" not in log, log[-3000:]
        assert json.loads(schema.read_text())["openapi"] == "3.1.0"
