"""How ``schema5-home.tar.gz`` was made: a home written by GPUlayer at store schema 5.

Not a test. Run it with the code from before store migration 6 (issue 23), never today's::

    mkdir /tmp/v5 && git archive fc1c3cd~1 | tar -x -C /tmp/v5
    PYTHONPATH=/tmp/v5 python tests/store/data/make_schema5.py tests/store/data/schema5-home.tar.gz

It serves a home with a simulated local worker, then writes what an upgrade must keep: users,
client and join tokens, a sealed secret, finished jobs with logs, a queued job, a session with a
cell. The admin token is saved beside the database (``admin.token``) for the test to use.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import time
from pathlib import Path

from gpulayer_kernel.client.admin import AdminCalls
from gpulayer_kernel.contracts import (
    CellRequest,
    CommandWorkload,
    JobSpec,
    Resources,
    SessionHolder,
    SessionSpec,
)
from gpulayer_kernel.store.sqlite import LATEST_SCHEMA
from gpulayer_kernel.testing.processes import ServeProcess


def main(out: Path) -> None:
    assert LATEST_SCHEMA == 5, f"run this with the schema-5 code, not schema {LATEST_SCHEMA}"
    root = Path(tempfile.mkdtemp())
    home = root / "home"
    args = ("--local-worker", "--simulate-gpus", "2")
    with ServeProcess(home, args=args) as server, server.client() as c:
        c._run(AdminCalls().add_user("alice", "user"))  # the sync Client had no add_user
        c.create_token("client", user="alice", name="alice-laptop")
        c.create_token("join", ttl=3600)
        c.set_secret("HF_TOKEN", "hf-not-a-real-token")
        for i in range(3):
            argv = ["python3", "-c", f"print('line one of {i}'); print('line two of {i}')"]
            job = c.submit(JobSpec(name=f"old-{i}", workload=CommandWorkload(argv=argv)))
            c.wait(job.id, timeout=60)
        failing = JobSpec(name="old-fails", workload=CommandWorkload(argv=["false"]))
        c.wait(c.submit(failing).id, timeout=60)
        c.submit(
            JobSpec(
                name="old-queued",
                workload=CommandWorkload(argv=["true"]),
                resources=Resources(gpus=8),
            )
        )
        info = c.start_session(SessionSpec(name="old-session", holder=SessionHolder(client="k1")))
        deadline = time.monotonic() + 60
        while c.get_session(info.name).status != "ready" and time.monotonic() < deadline:
            time.sleep(0.2)
        c.run_cell(info.name, CellRequest(code="x = 41\nprint(x + 1)", client="k1"), wait=30)
        c.stop_session(info.name)
        (home / "admin.token").write_text(server.admin_token)
    with tarfile.open(out, "w:gz") as tar:
        for name in ("gpulayer.db", "secrets.key", "admin.token", "artifacts"):
            if (home / name).exists():
                tar.add(home / name, arcname=name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
