"""Two ways jupyter_client 8.10's ``shutdown_all`` fails, and so the Jupyter server's shutdown:
a kernel whose start failed stays among its pending kernels (404), and a kernel being restarted
has a ``ready`` future not yet done (``InvalidStateError``). The extension forgets the first and
settles the second as it stops. These are the upstream reproductions written into ADR 0021, with
the workarounds applied; the restarts are real ipykernel processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado.web import HTTPError
from traitlets.config import Config

from gpulayer_kernel.jupyter.pending import forget_failed_starts, settle_restarts


@pytest.fixture
def broken_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    folder = tmp_path / "kernels" / "broken"
    folder.mkdir(parents=True)
    spec = {"argv": ["/nonexistent/python", "-f", "{connection_file}"], "language": "python"}
    (folder / "kernel.json").write_text(json.dumps({**spec, "display_name": "Broken"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    return "broken"


Manager = Callable[..., AsyncMappingKernelManager]


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[Manager]:
    """Kernel managers whose connection files go to ``tmp_path`` (their default: the cwd), each
    shut down with its kernels and its zmq context closed at the test's end, on the test's loop:
    a context left to the garbage collector blocked an xdist worker's exit (its ``term``) in a
    CI run."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(exist_ok=True)
    made: list[AsyncMappingKernelManager] = []

    def make(config: Config | None = None) -> AsyncMappingKernelManager:
        km = AsyncMappingKernelManager(connection_dir=str(runtime), config=config or Config())
        made.append(km)
        return km

    try:
        yield make
    finally:
        for km in made:
            forget_failed_starts(km, logging.getLogger("test"))
            await km.shutdown_all(now=True)
            open_sockets = [s for s in km.context._sockets if not s.closed]
            km.context.destroy(linger=0)
            assert not open_sockets, open_sockets


async def start_failing(km: AsyncMappingKernelManager, name: str) -> str:
    with pytest.raises(FileNotFoundError):
        await km.start_kernel(kernel_name=name)
    (kernel_id,) = km._pending_kernels  # kept there, though its start task is over
    assert km.list_kernel_ids() == []
    return str(kernel_id)


async def test_a_failed_start_breaks_shutdown_all_upstream(
    broken_spec: str, manager: Manager
) -> None:
    km = manager()
    kernel_id = await start_failing(km, broken_spec)
    with pytest.raises(HTTPError) as err:  # if this stops failing, jupyter_client fixed it
        await km.shutdown_all()
    assert err.value.status_code == 404 and kernel_id in str(err.value)


async def test_forgetting_failed_starts_lets_shutdown_all_finish(
    broken_spec: str, caplog: pytest.LogCaptureFixture, manager: Manager
) -> None:
    km = manager()
    kernel_id = await start_failing(km, broken_spec)
    log = logging.getLogger("test")
    with caplog.at_level(logging.INFO, "test"):
        forget_failed_starts(km, log)
    assert kernel_id not in km._pending_kernels
    assert f"forgot kernel {kernel_id}" in caplog.text
    await km.shutdown_all()
    forget_failed_starts(object(), log)  # anything that is not a kernel manager: left alone


@pytest.fixture
async def kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manager: Manager
) -> AsyncMappingKernelManager:
    """A kernel manager whose restarter looks every 0.1 s, with one real ipykernel started."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    km = manager(Config({"KernelRestarter": {"time_to_dead": 0.1}}))
    await km.start_kernel(kernel_name="python3")
    return km


async def restarting(km: AsyncMappingKernelManager) -> asyncio.Task[None]:
    """A restart of its one kernel, under way: its start half runs."""
    (kernel,) = km._kernels.values()
    task = asyncio.ensure_future(kernel.restart_kernel(now=True))
    for _ in range(400):
        if kernel._ready is not None and not kernel._ready.done():
            return task
        await asyncio.sleep(0.005)
    raise AssertionError("the restart's start did not begin")


async def test_a_restart_under_way_breaks_shutdown_all_upstream(
    kernels: AsyncMappingKernelManager,
) -> None:
    task = await restarting(kernels)
    with pytest.raises(asyncio.InvalidStateError):  # if this stops failing, upstream fixed it
        await kernels.shutdown_all()
    await task


async def test_settling_restarts_lets_shutdown_all_finish(
    kernels: AsyncMappingKernelManager,
) -> None:
    task = await restarting(kernels)
    await settle_restarts(kernels, logging.getLogger("test"))
    assert task.done() and task.exception() is None
    await kernels.shutdown_all()
    assert kernels.list_kernel_ids() == []


async def test_a_kernel_that_dies_after_settling_is_not_started_again(
    kernels: AsyncMappingKernelManager,
) -> None:
    (kernel,) = kernels._kernels.values()

    def pid() -> int | None:
        process = kernel.provisioner.process if kernel.provisioner is not None else None
        return None if process is None else int(process.pid)

    async def until(check: Callable[[], bool], what: str) -> None:
        for _ in range(600):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {what} within 30 s")

    # Before: the restarter starts a killed kernel again (a new process).
    first = pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await until(lambda: pid() not in (first, None) and kernel.ready.done(), "restart")
    await settle_restarts(kernels, logging.getLogger("test"))
    second = pid()
    assert second is not None
    os.kill(second, signal.SIGKILL)
    await asyncio.sleep(1.0)  # ten rounds of its restarter
    assert pid() == second and not await kernel.is_alive()
