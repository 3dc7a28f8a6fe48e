"""Inside a job, GPUlayer is the one that placed it: a served worker gives each job a token
scoped to it (``GPULAYER_URL`` and ``GPULAYER_TOKEN``), so ``gpulayer jobs`` and ``Client()``
in every rank of a 2-GPU job reach that control plane as the job's owner, with no embedded
control plane opened in ``~/.gpulayer`` (whose lock two ranks raced for). The token cannot make
tokens, and stops working when the job ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.testing import ServeProcess, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CODE = """
import os, subprocess, sys
from gpulayer_kernel.client.clients import Client
me = os.environ["GPULAYER_JOB_ID"]
c = Client(os.environ["GPULAYER_URL"].split(",")[0], os.environ["GPULAYER_TOKEN"])
job = c.get(me)
listed = subprocess.run([sys.executable, "-m", "gpulayer_kernel.cli", "jobs"],
                        capture_output=True, text=True)
print("rank", os.environ.get("RANK", "0"), job.owner, job.state.value, me[:8] in listed.stdout,
      listed.returncode, os.path.exists(os.path.expanduser("~/.gpulayer/gpulayer.db")))
try:
    c.create_token("client")
    made = "made"
except Exception as exc:
    made = getattr(exc, "code", repr(exc))
print("token", os.environ["GPULAYER_TOKEN"], made)  # redacted in the log, as a secret is
path = os.environ["TOKEN_FILE"] + os.environ.get("RANK", "0")
open(path, "w").write(os.environ["GPULAYER_TOKEN"])
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServeProcess, WorkerProcess]]:
    server = ServeProcess(tmp_path / "cp").start()
    worker = WorkerProcess(
        server.url,
        server.create_token("join"),
        name="w",
        simulate_gpus=2,
        home=tmp_path / "w",
        env={"HOME": str(tmp_path / "job-home")},
    ).start()
    try:
        yield server, worker
    finally:
        worker.stop()
        server.stop()


def test_every_rank_reaches_the_control_plane_that_placed_it(served: Any, tmp_path: Path) -> None:
    server, _ = served
    spec = JobSpec(
        name="ranks",
        workload=CommandWorkload(argv=[sys.executable, "-c", CODE]),
        resources=Resources(gpus=2),
        env={"TOKEN_FILE": str(tmp_path / "token-")},
    )
    with server.client() as c:
        job = c.submit(spec)
        done = c.wait(job.id, timeout=120)
        lines = [r.text for r in c.logs(job.id).records]
    assert done.state == JobState.SUCCEEDED, (done.reason, lines)
    ranks = [line.split() for line in lines if line.startswith("rank")]
    assert sorted(r[1] for r in ranks) == ["0", "1"], lines  # both ranks of the gang
    for r in ranks:
        # its owner, running, listed by the CLI in the job, and no ~/.gpulayer database opened
        assert r[2:] == ["admin", "running", "True", "0", "False"], r
    said = [line.split() for line in lines if line.startswith("token ")]
    token = (tmp_path / "token-0").read_text()
    assert token.startswith("glt_s_")
    assert {s[1] for s in said} == {"***"}  # redacted from the job's log, as a secret is
    assert {s[2] for s in said} == {"job_token_scope"}  # no token made with it
    # what it may not do: make tokens; and after its job ended, anything
    r = httpx.get(f"{server.url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and r.json()["code"] == "token_job_ended"
