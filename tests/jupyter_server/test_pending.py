"""jupyter_client 8.10 keeps a kernel whose start failed among its pending kernels, so the
server's ``shutdown_all`` fails on it (404); the extension forgets such kernels as it stops.
This is the upstream reproduction written into ADR 0021, with the workaround applied."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado.web import HTTPError

from gpulayer_kernel.jupyter.pending import forget_failed_starts


@pytest.fixture
def broken_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    folder = tmp_path / "kernels" / "broken"
    folder.mkdir(parents=True)
    spec = {"argv": ["/nonexistent/python", "-f", "{connection_file}"], "language": "python"}
    (folder / "kernel.json").write_text(json.dumps({**spec, "display_name": "Broken"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    return "broken"


async def start_failing(km: AsyncMappingKernelManager, name: str) -> str:
    with pytest.raises(FileNotFoundError):
        await km.start_kernel(kernel_name=name)
    (kernel_id,) = km._pending_kernels  # kept there, though its start task is over
    assert km.list_kernel_ids() == []
    return str(kernel_id)


async def test_a_failed_start_breaks_shutdown_all_upstream(broken_spec: str) -> None:
    km = AsyncMappingKernelManager()
    kernel_id = await start_failing(km, broken_spec)
    with pytest.raises(HTTPError) as err:  # if this stops failing, jupyter_client fixed it
        await km.shutdown_all()
    assert err.value.status_code == 404 and kernel_id in str(err.value)


async def test_forgetting_failed_starts_lets_shutdown_all_finish(
    broken_spec: str, caplog: pytest.LogCaptureFixture
) -> None:
    km = AsyncMappingKernelManager()
    kernel_id = await start_failing(km, broken_spec)
    log = logging.getLogger("test")
    with caplog.at_level(logging.INFO, "test"):
        forget_failed_starts(km, log)
    assert kernel_id not in km._pending_kernels
    assert f"forgot kernel {kernel_id}" in caplog.text
    await km.shutdown_all()
    forget_failed_starts(object(), log)  # anything that is not a kernel manager: left alone
