"""Light spares for light work (issue 25): on a real worker, a Python job forks from the
preloading zygote only when its source imports torch, and a job routed the wrong way still runs
correctly (it imports what it needs itself)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import Job, JobSpec, JobState, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.zygote import PRELOAD_ENV

from ..conftest import WorkerFactory

# Stands in for torch in the preloading zygote: cheap to import, and never imported by the
# runner, so a job can tell which zygote it was forked from.
MARKER = "fractions"
FORKED_FROM = f"import sys\n'{MARKER}' in sys.modules"


@pytest.fixture
async def gl_preloading_worker(
    gl_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[WorkerAgent]:
    """A worker whose Python jobs' zygote preloads MARKER, both zygotes up with their spares."""
    monkeypatch.setenv(PRELOAD_ENV, MARKER)
    agent = await gl_worker(warm_pool=1)
    yield agent
    agent.warm_runner.close()


async def _cell(cp: ControlPlane, source: str) -> Job:
    digest, data = bundles.build({"cell.py": source.encode()})
    await cp.put_bundle(data, digest)
    wl = PythonWorkload(bundle=digest, entrypoint="cell:cell.py")
    job = await cp.submit(JobSpec(workload=wl))
    done = await cp.wait(job.id, timeout=60)
    assert done.state == JobState.SUCCEEDED, (done.state, done.reason)
    return done


async def _both_ready(cp: ControlPlane, agent: WorkerAgent) -> None:
    await _cell(cp, "None")  # the first Python job starts both zygotes
    runner = agent.warm_runner
    await until(lambda: runner.spares() == 1 and runner.spares(light=True) == 1, 30, what="spares")


async def test_only_torch_importing_jobs_fork_from_the_preloading_zygote(
    gl_cp: ControlPlane, gl_preloading_worker: WorkerAgent
) -> None:
    await _both_ready(gl_cp, gl_preloading_worker)
    light = await _cell(gl_cp, FORKED_FROM)
    # The import is never run: the judgement reads the source, not what it does.
    heavy = await _cell(gl_cp, "if False:\n    import torch\n" + FORKED_FROM)
    assert (light.result, heavy.result) == (False, True)


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
async def test_wrongly_routed_jobs_still_run_correctly(
    gl_cp: ControlPlane, gl_preloading_worker: WorkerAgent
) -> None:
    await _both_ready(gl_cp, gl_preloading_worker)
    # A torch import the AST cannot see: light zygote; the job imports torch itself, slower.
    hidden = "exec('import torch')\n" + "[float(torch.ones(3).sum()), " + FORKED_FROM[11:] + "]"
    job = await _cell(gl_cp, "import sys\n" + hidden)
    assert job.result == [3.0, False]
    # A computed import name: cannot be judged, so the preloading zygote; still just Python.
    job = await _cell(gl_cp, "name = 'json'\nmod = __import__(name)\n" + FORKED_FROM)
    assert job.result is True


async def test_a_job_in_the_bundle_is_judged_through_its_own_modules(
    gl_cp: ControlPlane, gl_preloading_worker: WorkerAgent, tmp_path: Path
) -> None:
    await _both_ready(gl_cp, gl_preloading_worker)
    files = {
        "main.py": b"import helper\nprint(helper.where())\n",
        "helper.py": b"import sys\nif False:\n    import torch\n"
        + f"def where():\n    return '{MARKER}' in sys.modules\n".encode(),
    }
    digest, data = bundles.build(files)
    await gl_cp.put_bundle(data, digest)
    job = await gl_cp.submit(JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="main.py")))
    done = await gl_cp.wait(job.id, timeout=60)
    page = await gl_cp.logs(job.id)
    assert done.state == JobState.SUCCEEDED, done.reason
    assert [r.text for r in page.records if r.stream == "stdout"] == ["True"]
