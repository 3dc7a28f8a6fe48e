"""gpulayer_kernel.pytest_plugin: its clocks, and that loading it stays light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.clock import SYSTEM_CLOCK, Clock
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
from gpulayer_kernel.pytest_plugin import until
from gpulayer_kernel.testing import FakeClock


def test_gl_clock_is_the_system_clock_unless_marked(gl_clock: Clock) -> None:
    assert gl_clock is SYSTEM_CLOCK


@pytest.mark.gl_fake_clock(start=1000.0)
async def test_the_marker_makes_gl_clock_the_fake_one_at_its_start(
    gl_clock: FakeClock, gl_fake_clock: FakeClock
) -> None:
    assert gl_clock is gl_fake_clock
    assert gl_clock.now() == 1000.0
    await gl_clock.advance(5)
    assert gl_clock.now() == 1005.0


def test_loading_the_plugin_imports_no_framework() -> None:
    # pytest loads it in every run: the control plane, pydantic, Jupyter and torch wait for a
    # fixture that needs them.
    code = (
        "import sys, gpulayer_kernel.pytest_plugin\n"
        "heavy = ('torch', 'jupyter_server', 'jupyter_client', 'IPython', 'pydantic',"
        " 'gpulayer_kernel.controlplane', 'gpulayer_kernel.contracts')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.gl_fake_clock  # the example of docs/development.md, as written there
async def test_the_documented_example(gl_cp: Any, gl_worker: Any, gl_clock: Any) -> None:
    agent = await gl_worker()
    job = await gl_cp.submit(JobSpec(workload=CommandWorkload(argv=["sleep", "30"])))

    async def state_is(state: JobState) -> bool:
        return bool((await gl_cp.get(job.id)).state == state)

    await until(lambda: state_is(JobState.RUNNING), what="the job to run")
    for loop in agent._loops:  # the worker "dies": it never heartbeats again
        loop.cancel()

    async def lost() -> bool:  # the heartbeat timeout is 2 s of the fake clock
        await gl_clock.advance(0.5)
        return await state_is(JobState.LOST)

    await until(lost, 20, what="the job to be lost")


@pytest.mark.slow  # ~5 s: a pytest of its own
def test_another_project_loads_the_plugin_in_strict_mode(tmp_path: Path) -> None:
    # As an extension's own suite would: no conftest of ours, pytest-asyncio's strict mode.
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["gpulayer_kernel.pytest_plugin"]\n')
    (tmp_path / "test_ext.py").write_text(
        "import pytest\n"
        "from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState\n"
        "from gpulayer_kernel.pytest_plugin import until\n\n"
        "@pytest.mark.asyncio\n"
        "@pytest.mark.gl_fake_clock(start=5.0)\n"
        "async def test_it(gl_cp, gl_worker, gl_clock, gl_home):\n"
        "    assert gl_clock.now() == 5.0 and gl_home.name == 'gpulayer-home'\n"
        "    await gl_worker()\n"
        "    job = await gl_cp.submit(JobSpec(workload=CommandWorkload(argv=['true'])))\n"
        "    async def done():\n"
        "        return (await gl_cp.get(job.id)).state == JobState.SUCCEEDED\n"
        "    await until(done, 30, what='the job to succeed')\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    args = ["-c", "/dev/null", "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q"]
    args += ["-o", "asyncio_mode=strict", "--strict-markers", "-p", "no:randomly"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
