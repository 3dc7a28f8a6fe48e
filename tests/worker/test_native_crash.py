"""A job that dies of a native crash (C++'s std::terminate, a segfault in an extension) says where:
its ranks' runner enables ``faulthandler``, so the signal comes with each thread's Python stack."""

from __future__ import annotations

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import JobSpec, JobState, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane

from ..conftest import WorkerFactory

CELL = """\
import os

def deep_in_a_library():
    os.abort()  # what std::terminate does: SIGABRT

print("before the crash", flush=True)
deep_in_a_library()
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
async def test_a_sigabrt_shows_the_python_stack_it_happened_in(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, warm: bool
) -> None:
    await gl_worker(warm_runner=warm)
    digest, data = bundles.build({"cell.py": CELL.encode()})
    await gl_cp.put_bundle(data, digest)
    job = await gl_cp.submit(
        JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py"))
    )
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.FAILED and "SIGABRT" in (done.reason or ""), done.reason
    texts = [r.text for r in (await gl_cp.logs(job.id, limit=100)).records]
    assert "before the crash" in texts
    assert "Fatal Python error: Aborted" in texts, texts
    frames = [t for t in texts if t.strip().startswith("File ")]
    assert any("line 4 in deep_in_a_library" in t for t in frames), texts
    assert any("line 7 in <module>" in t for t in frames), texts
