"""run_probe against real subprocesses: this CPU-only machine, and probes that hang, crash or
babble."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from gpulayer_kernel.capabilities import run_probe
from gpulayer_kernel.testing import wait_until


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan is reaped by whatever init the container has, or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for the interpreter (it ignores ``-m module``)."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
async def test_real_probe_on_this_machine() -> None:
    caps = await run_probe(timeout=120)
    assert not any(e.startswith("probe:") for e in caps.probe_errors), caps.probe_errors
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        # A CPU-only machine (where this was written): no devices, no crash, reasons given.
        assert caps.devices == [] and caps.runtime == "cpu"
        assert not caps.frameworks.cuda_available
        assert "nvidia-smi: not found on PATH" in caps.probe_errors
    else:
        assert caps.devices and caps.runtime == "cuda", caps.probe_errors
    if importlib.util.find_spec("torch") is not None:
        assert caps.frameworks.torch_version is not None  # reported as found
    else:
        assert "torch: not installed" in caps.probe_errors
    assert caps.host.cpus >= 1 and caps.host.python


async def test_real_probe_passes_arguments() -> None:
    caps = await run_probe(timeout=60, args=["--no-torch", "--simulate-gpus", "3"])
    assert caps.simulated and len(caps.devices) == 3
    assert {d.vendor for d in caps.devices} == {"sim"}
    assert caps.frameworks.torch_version is None


async def test_a_hanging_probe_times_out_and_its_children_die(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    python = fake_python(tmp_path, f"sleep 60 & echo $! > {pidfile}; wait")
    started = time.monotonic()
    caps = await run_probe(timeout=1.0, python=python)
    assert time.monotonic() - started < 15
    assert caps.devices == [] and caps.runtime == "cpu"
    assert caps.probe_errors == [
        "probe: timed out after 1 s (a driver or torch import hung); "
        "this worker offers CPU only until a probe succeeds"
    ]
    assert caps.host.cpus >= 1  # host facts still come from the parent
    child = int(pidfile.read_text())
    wait_until(lambda: not alive(child), 5, what="the probe's child to die with the timeout")


async def test_a_crashing_probe_is_a_reason(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo 'Fatal Python error: Segmentation fault' >&2; exit 139")
    caps = await run_probe(timeout=10, python=python)
    assert caps.devices == []
    assert caps.probe_errors == [
        "probe: exited with status 139: Fatal Python error: Segmentation fault"
    ]


async def test_garbage_output_is_a_reason(tmp_path: Path) -> None:
    caps = await run_probe(timeout=10, python=fake_python(tmp_path, "echo '{\"devices\": 7}'"))
    assert caps.devices == []
    assert caps.probe_errors == ['probe: printed {"devices": 7}, not WorkerCapabilities JSON']
    caps = await run_probe(timeout=10, python=fake_python(tmp_path, "exit 0"))
    assert caps.probe_errors == ["probe: printed nothing, not WorkerCapabilities JSON"]


async def test_a_missing_interpreter_is_a_reason(tmp_path: Path) -> None:
    caps = await run_probe(timeout=10, python=str(tmp_path / "no-such-python"))
    assert caps.devices == []
    assert caps.probe_errors[0].startswith("probe: could not start ")
    assert "FileNotFoundError" in caps.probe_errors[0]
