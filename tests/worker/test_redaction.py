"""A job's secret never leaves its worker in the clear: not in logs, its result or its progress."""

from __future__ import annotations

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import JobSpec, JobState, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.redact import MASK

from ..conftest import WorkerFactory

CANARY = "canary-9e8d7c6b5a4f3e2d1c0b"

CELL = """\
import os, sys, time
from gpulayer_kernel import job
secret = os.environ["CANARY"]
sys.stdout.write("x" * 65530 + secret); sys.stdout.flush(); time.sleep(0.2); print()
job.progress(step=1, note=f"token {secret}", nested={"k": [secret]})
time.sleep(0.3)  # the progress report goes out before the job ends
{"value": secret, "list": [1, secret]}
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
async def test_a_canary_is_masked_in_logs_result_and_progress(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, warm: bool
) -> None:
    await gl_worker(warm_runner=warm)
    await gl_cp.set_secret("CANARY", CANARY)
    digest, data = bundles.build({"cell.py": CELL.encode()})
    await gl_cp.put_bundle(data, digest)
    job = await gl_cp.submit(
        JobSpec(
            workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py"), secrets=["CANARY"]
        )
    )
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED, done.reason
    assert done.result == {"value": MASK, "list": [1, MASK]}
    assert done.progress == {"step": 1, "note": f"token {MASK}", "nested": {"k": [MASK]}}
    page = await gl_cp.logs(job.id, limit=100)
    texts = [r.text for r in page.records]
    assert "".join(t for t in texts if t.startswith("x")) == "x" * 65530 + MASK
    every = repr(texts) + done.model_dump_json()
    assert not [CANARY[i : i + 6] for i in range(len(CANARY) - 5) if CANARY[i : i + 6] in every]
