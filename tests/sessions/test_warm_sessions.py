"""A GPU worker starts its sessions' zygote when it starts (``GPULAYER_WARM_SESSIONS``), so the
first session's first cell finds its preload imported; elsewhere the zygote starts with the
first session, whose ranks fork from a bare interpreter meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer_kernel.contracts import Device, WorkerCapabilities
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import InvalidInput
from gpulayer_kernel.pytest_plugin import sim_caps
from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.warm import warm_sessions

from ..conftest import WorkerFactory
from .conftest import run, spec, up

PROBE = "import sys\n'colorsys' in sys.modules"  # imported by the preload below, by nothing else


async def _probe(cp: ControlPlane, name: str) -> str:
    value = (await run(cp, name, PROBE)).cell.value
    data = value["data"] if isinstance(value, dict) else None
    assert isinstance(data, dict), value
    return str(data["text/plain"])


def _gpu(vendor: str) -> WorkerCapabilities:
    return WorkerCapabilities(devices=[Device(index=0, vendor=vendor, name="x", kind="x")])


def test_automatic_means_a_worker_with_a_gpu_that_is_not_simulated() -> None:
    for vendor in ("nvidia", "amd", "apple"):
        assert warm_sessions(None, _gpu(vendor)), vendor
    for caps in (_gpu("sim"), _gpu("cpu"), sim_caps(2), WorkerCapabilities()):
        assert not warm_sessions(None, caps), caps
    assert warm_sessions(True, WorkerCapabilities())
    assert not warm_sessions(False, _gpu("nvidia"))


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("0", False), ("", None), ("AUTO", None)])
def test_the_setting_from_the_environment(
    raw: str, want: bool | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPULAYER_WARM_SESSIONS", raw)
    assert ExecutorConfig(work_root=tmp_path).warm_sessions is want


@pytest.mark.parametrize("raw", ["yes", "2", "on"])
def test_a_bad_setting_is_refused_naming_it(
    raw: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPULAYER_WARM_SESSIONS", raw)
    with pytest.raises(InvalidInput) as err:
        ExecutorConfig(work_root=tmp_path)
    assert "GPULAYER_WARM_SESSIONS" in err.value.message and repr(raw) in err.value.message


@pytest.mark.slow
async def test_a_warm_worker_s_first_session_finds_its_preload(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "colorsys")
    agent = await gl_worker(warm_sessions=True)
    await until(agent.session_runner.warm, 60, what="the sessions' zygote to come up")
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    assert await _probe(gl_cp, "s1") == "True"


@pytest.mark.slow
async def test_otherwise_the_first_session_starts_the_zygote_and_does_not_wait_for_it(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "colorsys")
    agent = await gl_worker(gpus=1)  # simulated: automatic means off
    assert not agent.session_runner.warm()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    assert await _probe(gl_cp, "s1") == "False"
    await until(agent.session_runner.warm, 60, what="the sessions' zygote to come up")
    await gl_cp.start_session(spec("s2"))
    await up(gl_cp, "s2")
    assert await _probe(gl_cp, "s2") == "True"
