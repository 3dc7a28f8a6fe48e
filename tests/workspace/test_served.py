"""Workspaces across real processes: ``gpulayer serve``, a ``gpulayer worker`` that is another
machine as far as disks go (``--host-id``), and the Jupyter host here (a real ipykernel through
the provisioner, or the host's end driven directly). Then the failures: the control plane
killed with SIGKILL mid-sync, and the worker killed mid-sync."""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.client.connect import TOKEN_ENV, URL_ENV
from gpulayer_kernel.client.workspace import HttpWorkspaceLink
from gpulayer_kernel.contracts import JobState, SessionHolder, SessionSpec
from gpulayer_kernel.contracts.jobs import Resources
from gpulayer_kernel.contracts.workspace import WorkspaceSource
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.kernels import spec
from gpulayer_kernel.kernels.host import host, use_link
from gpulayer_kernel.kernels.link import HttpLink
from gpulayer_kernel.testing.processes import ServeProcess, WorkerProcess
from gpulayer_kernel.testing.waiting import until, wait_until
from gpulayer_kernel.wire.http import Wire
from gpulayer_kernel.workspace.host import HostWorkspace
from gpulayer_kernel.workspace.names import TMP_PREFIX
from gpulayer_kernel.workspace.plan import host_id

from .conftest import notebook_folder
from .test_kernel_workspace import run, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def gl_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "IPYTHONDIR"):
        (tmp_path / var).mkdir()
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "JUPYTER_DATA_DIR"))
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "here"))
    spec.install(gpus=1, gpu_kind=[], user=True, wait=30)
    server = ServeProcess(tmp_path / "cp", heartbeat_timeout=3.0).start()
    worker = WorkerProcess(
        server.url,
        server.create_token("join"),
        name="far",
        simulate_gpus=2,
        home=tmp_path / "far",
        args=("--host-id", "another-machine"),
        env={"GPULAYER_SESSION_PRELOAD": ""},
    ).start()
    monkeypatch.setenv(URL_ENV, server.url)
    monkeypatch.setenv(TOKEN_ENV, server.admin_token)
    try:
        yield server, worker
    finally:
        h = host()
        if h._link is not None:  # its streams and connections closed, not left to the GC
            h.submit(h._link.close()).result(30)
        h._link = None
        worker.stop()
        server.stop()


async def test_a_kernel_on_a_worker_without_the_disk_gets_the_folder_and_gives_outputs_back(
    gl_served: Any, tmp_path: Path
) -> None:
    server, _ = gl_served
    use_link(HttpLink(server.url, server.admin_token))
    folder = notebook_folder(tmp_path)
    km, kc = await start(folder)
    try:
        _, out = await run(kc, "import os, helpers\nprint(os.getcwd(), helpers.total([2, 3]))")
        where, total = out.split()
        assert total == "5" and where != str(folder) and "/far/work/sessions/" in where
        (folder / "helpers.py").write_text("def total(rows):\n    return -1\n")
        _, out = await run(
            kc, "import importlib\nimportlib.reload(helpers)\nprint(helpers.total([]))"
        )
        assert out.strip() == "-1"
        await run(kc, "open('results.csv', 'w').write('ok')")
        await until(lambda: (folder / "results.csv").exists(), 30)
        assert (folder / "results.csv").read_text() == "ok"
        with server.client() as c:
            (info,) = c.list_sessions()
        assert info.workspace.mode == "synced" and info.workspace.folder == str(folder)
    finally:
        await stop(km, kc)


def make_folder(root: Path, files: int, size: int) -> dict[str, str]:
    root.mkdir(parents=True)
    rng = random.Random(7)
    want = {}
    for i in range(files):
        data = rng.randbytes(size)
        name = f"d{i % 10}/f{i}.bin"
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(data)
        want[name] = hashlib.sha256(data).hexdigest()
    return want


def worker_folder(worker: WorkerProcess, job_id: str) -> Path:
    (found,) = (worker.home / "work" / "sessions").glob(f"{job_id}-*/workspace")
    return found


def assert_never_a_mix(folder: Path, want: dict[str, list[str]]) -> int:
    """Every file there is one the host sent under that name (old or new), never a mix; the
    temporaries a killed write left are no user's file. How many files it holds."""
    n = 0
    for path in folder.rglob("*"):
        if path.is_dir() or path.name.startswith(TMP_PREFIX):
            continue
        rel = path.relative_to(folder).as_posix()
        assert hashlib.sha256(path.read_bytes()).hexdigest() in want[rel], rel
        n += 1
    return n


async def session_with_workspace(server: ServeProcess, folder: Path) -> Any:
    with server.client() as c:
        info = c.start_session(
            SessionSpec(
                name="ws",
                resources=Resources(gpus=1),
                holder=SessionHolder(client="test"),
                workspace=WorkspaceSource(folder=str(folder), host=host_id()),
            )
        )
        wait_until(lambda: c.get_session(info.id).job.state == JobState.RUNNING, 60)
    return info


# A connection the SIGKILL cut mid-request is sometimes left to the garbage collector by
# httpcore (an unclosed-socket ResourceWarning at a random later moment): not a leak of ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_the_control_plane_killed_mid_sync_loses_nothing(
    gl_served: Any, tmp_path: Path
) -> None:
    server, worker = gl_served
    folder = tmp_path / "big"
    want = make_folder(folder, 300, 200_000)  # 60 MB: a sync that takes a while
    info = await session_with_workspace(server, folder)
    wire = Wire(server.url, server.admin_token, timeout=60)
    link = HttpWorkspaceLink(wire)
    ws = HostWorkspace(folder, info.id, link)
    try:
        syncing = asyncio.ensure_future(ws.before_cell())
        await asyncio.sleep(random.uniform(0.05, 0.4))  # somewhere in the sync
        assert not syncing.done(), "the sync ended before the kill: make the folder bigger"
        server.kill(signal.SIGKILL)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)  # same port, same state directory
        try:
            await syncing  # its calls are sent again to the new control plane
        except GPUlayerError as exc:
            assert exc.code, exc  # a clear error at worst; the next cell sends it all
            await ws.before_cell()
        assert ws.version >= 1
        there = worker_folder(worker, info.id)
        assert assert_never_a_mix(there, {k: [v] for k, v in want.items()}) == len(want)
    finally:
        ws.close()
        await wire.aclose()


async def test_the_worker_killed_mid_sync_leaves_no_mixed_file_and_a_clear_error(
    gl_served: Any, tmp_path: Path
) -> None:
    server, worker = gl_served
    folder = tmp_path / "big"
    want = make_folder(folder, 300, 200_000)
    info = await session_with_workspace(server, folder)
    wire = Wire(server.url, server.admin_token, timeout=60)
    link = HttpWorkspaceLink(wire)
    ws = HostWorkspace(folder, info.id, link)
    try:
        syncing = asyncio.ensure_future(ws.before_cell())
        await asyncio.sleep(random.uniform(0.05, 0.4))
        assert not syncing.done(), "the sync ended before the kill: make the folder bigger"
        worker.kill(signal.SIGKILL)
        with pytest.raises(GPUlayerError) as err:
            await syncing
        assert err.value.code in ("session_ended", "session_not_found"), err.value
        there = worker_folder(worker, info.id)
        assert_never_a_mix(there, {k: [v] for k, v in want.items()})
        assert sorted(p.name for p in folder.rglob("*.bin")) == sorted(
            Path(k).name for k in want
        )  # the notebook's folder is untouched
    finally:
        ws.close()
        await wire.aclose()
