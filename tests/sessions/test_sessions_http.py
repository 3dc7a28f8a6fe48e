"""Sessions across real processes: `gpulayer serve`, an HTTP `gpulayer worker`, the sync client.
A control-plane restart leaves the session running on its live worker, state and all."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CellRequest, CellState, SessionStatus
from gpulayer_kernel.testing import GL, ServeProcess, WorkerProcess, wait_until

from .conftest import HOLDER, spec

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    return env


def gl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GL, *args], capture_output=True, text=True, timeout=60, env=env)


def _run(client: object, code: str) -> object:
    c = client
    page = c.run_cell("s1", CellRequest(code=code, client=HOLDER.client), wait=30)  # type: ignore[attr-defined]
    records = list(page.records)
    while not page.finished:
        page = c.follow_cell("s1", page.cell.number, page.next_since, wait=30)  # type: ignore[attr-defined]
        records += page.records
    # A cell's lines may come in an earlier page than its end (seen in a fresh-clone run): all of
    # them, with the last page.
    return page.model_copy(update={"records": records})


def test_a_session_over_http_survives_a_control_plane_restart(tmp_path: Path) -> None:
    env = _env()
    with ServeProcess(tmp_path / "home", heartbeat_timeout=20, env=env) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=tmp_path / "w1", env=env):
            with server.client() as c:
                info = c.start_session(spec())
                wait_until(lambda: c.get_session("s1").status == SessionStatus.IDLE, 60)
                first = _run(c, "y = 41\nprint('hello over http')\ny + 1")
                assert first.cell.value["data"]["text/plain"] == "42"  # type: ignore[attr-defined]
                assert first.records[0].text == "hello over http"  # type: ignore[attr-defined]
                failed = _run(c, "1 / 0")
                assert failed.cell.state == CellState.ERROR  # type: ignore[attr-defined]
            server.restart()
            with server.client() as c:
                # The worker re-joins as itself; its session (a running job) is still there.
                wait_until(lambda: c.get_session("s1").status == SessionStatus.IDLE, 60)
                again = _run(c, "y")
                assert again.cell.value["data"]["text/plain"] == "41"  # type: ignore[attr-defined]
                assert again.cell.number == 3  # type: ignore[attr-defined]
                assert [x.number for x in c.session_cells("s1")] == [3, 2, 1]
            cli = {**env, **server.client_env(), "GPULAYER_HOME": str(tmp_path / "cli")}
            listed = gl(cli, "sessions")
            assert listed.returncode == 0 and "s1 [idle]" in listed.stdout
            assert "held by `train.ipynb`" in listed.stdout
            shown = gl(cli, "sessions", "show", "s1").stdout
            assert "[2] error" in shown and "ZeroDivisionError" in shown and "[1] ok" in shown
            assert gl(cli, "sessions", "cells", "s1", "--json").stdout.count('"number"') == 3
            logs = gl(cli, "logs", info.id).stdout
            assert "hello over http" in logs
            missing = gl(cli, "sessions", "show", "nope")
            assert missing.returncode == 2 and "no session 'nope'" in missing.stderr
            stopped = gl(cli, "sessions", "stop", "s1")
            assert "s1 stopped" in stopped.stdout
            with server.client() as c:
                job = c.wait(info.id, timeout=30)
                assert job.state.value == "cancelled"
                assert "stopped from the command line" in (job.reason or "")
