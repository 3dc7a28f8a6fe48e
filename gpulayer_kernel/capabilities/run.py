"""Run the probe in an isolated subprocess with a timeout (ADR 0005).

The probe imports torch and talks to drivers; either can hang or crash the process (a wedged GPU, a
torch built for another CUDA). So the worker never probes in its own process: ``run_probe`` starts
``python -m gpulayer_kernel.capabilities.probe`` in its own session, waits at most ``timeout``
seconds, and never raises. A timeout, a crash or output that is not ``WorkerCapabilities`` JSON
becomes a ``probe_errors`` line on a CPU-only result, so the worker still joins and runs CPU jobs
while the message says why it offers no GPU.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from ..contracts import HostFacts, WorkerCapabilities
from .host import read_host

PROBE_MODULE = "gpulayer_kernel.capabilities.probe"
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


async def run_probe(
    timeout: float = 30.0, python: str = sys.executable, args: Sequence[str] = ()
) -> WorkerCapabilities:
    """Probe this machine in a subprocess; never raises (failures become ``probe_errors``)."""
    env = probe_env()
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-m",
            PROBE_MODULE,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group, so a timeout kills its children too
        )
    except (OSError, ValueError) as exc:
        return _cpu_only(f"probe: could not start {python!r}: {type(exc).__name__}: {exc}")
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        return _cpu_only(
            f"probe: timed out after {timeout:g} s (a driver or torch import hung); "
            "this worker offers CPU only until a probe succeeds"
        )
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        await proc.wait()
        raise
    out = stdout.decode(errors="replace").strip()
    err = stderr.decode(errors="replace").strip()
    if proc.returncode != 0:
        tail = err.splitlines()[-1] if err else "no output on stderr"
        return _cpu_only(f"probe: exited with status {proc.returncode}: {_clip(tail)}")
    last = out.splitlines()[-1] if out else ""
    try:
        return WorkerCapabilities.model_validate_json(last)
    except ValidationError:
        shown = _clip(last) if last else "nothing"
        return _cpu_only(f"probe: printed {shown!s}, not WorkerCapabilities JSON")


def probe_env() -> dict[str, str]:
    """The probe process's environment: this one, able to import this very package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    return env


def _cpu_only(reason: str) -> WorkerCapabilities:
    try:
        host = read_host()
    except Exception:  # host facts are a nicety here; the reason is what matters
        host = HostFacts()
    return WorkerCapabilities(host=host, probe_errors=[reason])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
