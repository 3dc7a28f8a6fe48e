"""How a failing session cell reads (issue 36, LOW items): a second interrupt while IPython
formats the first one's traceback leaves the cell's own error; `.cuda()` on simulated GPUs says
they are simulated and what to use instead. Real rank processes on an in-process worker."""

from __future__ import annotations

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import CellRequest, CellState, JobSpec, PythonWorkload, Resources
from gpulayer_kernel.controlplane import ControlPlane

from ..conftest import WorkerFactory
from .conftest import run, spec, up

SLOW_ERROR = """
class SlowToSay(Exception):
    def __str__(self):
        import time
        print('formatting', flush=True)
        time.sleep(4)
        return 'said at last'

raise SlowToSay()
"""


@pytest.mark.slow  # ~20 s with two xdist workers on two cores
async def test_an_interrupt_while_the_traceback_is_formatted_keeps_the_cells_error(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    page = await gl_cp.run_cell("s1", CellRequest(code=SLOW_ERROR, client="kernel-a"), wait=10)
    # "formatting" is printed from inside the exception's __str__: the interrupt comes now.
    assert page.cell.state == CellState.RUNNING and page.records[0].text == "formatting"
    await gl_cp.interrupt_session("s1")
    while not page.finished:
        page = await gl_cp.follow_cell("s1", page.cell.number, page.next_since, wait=30)
    error = page.cell.error
    assert error is not None and error.ename == "SlowToSay", error
    assert "said at last" in error.evalue
    assert not any("pygments" in line for line in error.traceback)


@pytest.mark.slow  # ~5 s with two xdist workers on two cores
@pytest.mark.torch
async def test_cuda_on_simulated_gpus_says_they_are_simulated(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "torch")
    await gl_worker(gpus=1)
    await gl_cp.start_session(spec(gpus=1))
    await up(gl_cp, "s1", timeout=120)
    page = await run(gl_cp, "s1", "import torch\ntorch.zeros(1).cuda()")
    error = page.cell.error
    assert error is not None and "simulated" in "\n".join(error.traceback)
    assert "device()" in "\n".join(error.traceback)
    await gl_cp.stop_session("s1")  # its GPU, for the job below
    # The same line in a one-shot job: its log says so too.
    digest, data = bundles.build({"c.py": b"import torch\ntorch.zeros(1).cuda()\n"})
    await gl_cp.put_bundle(data, digest)
    job = await gl_cp.submit(
        JobSpec(
            workload=PythonWorkload(bundle=digest, entrypoint="c.py"), resources=Resources(gpus=1)
        )
    )
    done = await gl_cp.wait(job.id, timeout=120)
    texts = [r.text for r in (await gl_cp.logs(done.id, limit=1000)).records]
    assert any("simulated" in t and "device()" in t for t in texts), texts
