"""A GPU kernel in its notebook's folder: synced to a worker that does not see it, in place on
one that does. The kernel reads data.csv, imports helpers.py, sees an edit of helpers.py in
the next cell, and writes results.csv, which appears in the notebook's folder."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

from gpulayer_kernel.testing.waiting import until

from ..kernels.conftest import Plane
from .conftest import gated, notebook_folder

pytestmark = pytest.mark.slow


async def start(folder: Path) -> tuple[AsyncKernelManager, Any]:
    km = AsyncKernelManager(kernel_name="gpulayer-1gpu")
    await km.start_kernel(cwd=str(folder))
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


async def run(
    kc: Any, code: str, streams: tuple[str, ...] = ("stdout", "stderr")
) -> tuple[dict[str, Any], str]:
    """Run a cell; its reply and the text of its ``streams`` (the relay's own notes, such as
    what came back from the worker, are on stderr)."""
    seen: list[dict[str, Any]] = []
    reply = await kc.execute_interactive(code, output_hook=seen.append, timeout=60)
    text = "".join(
        m["content"].get("text", "")
        for m in seen
        if m["msg_type"] == "stream" and m["content"].get("name") in streams
    )
    errs = [m["content"] for m in seen if m["msg_type"] == "error"]
    assert reply["content"]["status"] == "ok", (errs, text)
    return reply, text


async def stop(km: AsyncKernelManager, kc: Any) -> None:
    kc.stop_channels()
    await km.shutdown_kernel(now=True)


async def test_a_synced_kernel_reads_imports_sees_edits_and_writes_back(
    gl_far: Plane, tmp_path: Path
) -> None:
    folder = notebook_folder(tmp_path)
    km, kc = await start(folder)
    try:
        (info,) = gl_far.call(gl_far.cp.list_sessions())
        _, out = await run(kc, "import os\nprint(os.getcwd())")
        assert out.strip() != str(folder)  # a copy on the worker, not the folder itself
        (info,) = gl_far.call(gl_far.cp.list_sessions())
        assert info.workspace is not None and info.workspace.mode == "synced"

        _, out = await run(kc, "print(open('data.csv').read())")
        assert "3,4" in out
        _, out = await run(kc, "import helpers\nprint(helpers.VALUE, helpers.total([1, 2]))")
        assert out.split() == ["1", "3"]

        (folder / "helpers.py").write_text("VALUE = 2\n\ndef total(rows):\n    return 0\n")
        _, out = await run(kc, "import importlib\nimportlib.reload(helpers)\nprint(helpers.VALUE)")
        assert out.strip() == "2"

        _, out = await run(kc, "open('results.csv', 'w').write('x\\n42\\n')")
        # Outputs come back just after the cell's reply (the next cell never waits for them).
        results = folder / "results.csv"
        await until(lambda: results.exists(), 20, what="results.csv written back")
        assert results.read_text() == "x\n42\n"
    finally:
        await stop(km, kc)


async def test_an_in_place_kernel_runs_in_the_notebook_folder(
    gl_near: Plane, tmp_path: Path
) -> None:
    folder = notebook_folder(tmp_path)
    km, kc = await start(folder)
    try:
        _, out = await run(kc, "import os, helpers\nprint(os.getcwd(), helpers.VALUE)")
        assert out.split() == [str(folder), "1"]
        (info,) = gl_near.call(gl_near.cp.list_sessions())
        assert info.workspace is not None and info.workspace.mode == "in_place"
        await run(kc, "open('results.csv', 'w').write('done')")
        assert (folder / "results.csv").read_text() == "done"
    finally:
        await stop(km, kc)


async def note(kc: Any, timeout: float = 20.0) -> str:
    """The workspace's words for the last cell (they come just after its reply)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        msg = await kc.get_iopub_msg(timeout=max(0.1, left))
        text = msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        if "gpulayer:" in text:
            return str(text)


async def test_a_folder_too_big_starts_the_kernel_without_a_workspace_and_says_so(
    gl_far: Plane, tmp_path: Path
) -> None:
    folder = notebook_folder(tmp_path)
    with open(folder / "weights.bin", "wb") as f:
        f.truncate(10 << 30)  # sparse
    km, kc = await start(folder)
    try:
        _, out = await run(kc, "import os\nprint(os.path.exists('data.csv'), 6 * 7)")
        # The kernel works, without the folder (the relay's note may come before or after the
        # cell's own line: the kernel's output can trail its reply, which the note follows).
        assert "False 42" in out.splitlines(), out
        said = out if "gpulayer:" in out else await note(kc)
        assert "the workspace was not synced" in said and "weights.bin (10 GiB)" in said
        assert ".gpulayerignore" in said
        (folder / ".gpulayerignore").write_text("*.bin\n")  # nothing lost: the folder is as it was
        assert (folder / "data.csv").read_text().startswith("a,b")
    finally:
        await stop(km, kc)


async def test_odd_names_reach_the_worker_exactly(gl_far: Plane, tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    folder.mkdir()
    names = [b"new\nline.txt", b"caf\xe9.csv", b"Data.csv", b"data.csv"]
    for n in names:
        with open(os.path.join(os.fsencode(folder), n), "wb") as f:
            f.write(n * 3)
    km, kc = await start(folder)
    try:
        code = (
            "import os, hashlib\n"
            "for n in sorted(os.listdir(b'.')):\n"
            "    print(n.hex(), hashlib.sha256(open(n, 'rb').read()).hexdigest())"
        )
        # Its stdout alone: a workspace note on stderr may land in the cell's output (a full
        # run had a fifth line there).
        _, out = await run(kc, code, streams=("stdout",))
        got = dict(line.split() for line in out.strip().splitlines())
        want = {n.hex(): hashlib.sha256(n * 3).hexdigest() for n in names}
        assert got == want, out
    finally:
        await stop(km, kc)


async def test_a_file_changed_on_both_sides_keeps_both_and_says_so(
    gl_far: Plane, tmp_path: Path
) -> None:
    folder = notebook_folder(tmp_path)
    km, kc = await start(folder)
    try:
        await run(kc, "open('out.txt', 'w').write('worker 1')")
        out_txt = folder / "out.txt"
        await until(lambda: out_txt.exists(), 20)
        # The cell rewrites out.txt while the user edits it here: both changed since the sync.
        started, go = tmp_path / "started", tmp_path / "go"
        cell = asyncio.ensure_future(
            run(kc, gated(started, go, "open('out.txt', 'w').write('worker 2')"))
        )
        await until(started.exists, 60, what="the cell to run on the worker")
        out_txt.write_text("my edit")
        go.touch()
        _, said = await cell
        said = said if "gpulayer:" in said else await note(kc)
        assert "out.txt changed here and on the worker" in said
        assert out_txt.read_text() == "my edit"  # never silently overwritten
        assert (folder / "out.worker-1.txt").read_text() == "worker 2"
    finally:
        await stop(km, kc)


async def test_a_big_output_stays_on_the_worker_until_pulled(
    gl_far: Plane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_kernel.client.workspace import CpWorkspaceLink
    from gpulayer_kernel.workspace.pulls import pull_files

    monkeypatch.setenv("GPULAYER_WORKSPACE_BACK_BYTES", "1000")
    folder = notebook_folder(tmp_path)
    km, kc = await start(folder)
    try:
        _, out = await run(kc, "open('big.bin', 'wb').write(b'x' * 5000)\nNone")
        said = out if "gpulayer:" in out else await note(kc)
        assert "left on the worker (over 1000 B): big.bin (4.9 KiB)" in said
        assert "%gpulayer pull big.bin" in said
        assert not (folder / "big.bin").exists()
        # %gpulayer pull inside the GPU kernel: it comes back at the end of that cell
        await run(kc, "%load_ext gpulayer_kernel")
        _, out = await run(kc, "%gpulayer pull big.bin")
        assert "coming back to the notebook's folder at the end of this cell" in out
        await until(lambda: (folder / "big.bin").exists(), 20)
        assert (folder / "big.bin").read_bytes() == b"x" * 5000
        # gpulayer pull (the terminal's way), with progress
        await run(kc, "open('big2.bin', 'wb').write(b'y' * 3000)\nNone")
        (info,) = gl_far.call(gl_far.cp.list_sessions())
        seen: list[tuple[int, int]] = []
        pulled = gl_far.call(
            pull_files(
                CpWorkspaceLink(gl_far.cp), info.id, ["big2.bin"], lambda d, t: seen.append((d, t))
            )
        )
        assert "big2.bin" in pulled and seen[-1] == (3000, 3000)
        assert (folder / "big2.bin").read_bytes() == b"y" * 3000
    finally:
        await stop(km, kc)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs where the far worker keeps its jobs (root only)."""
    where = tmp_path / "work-far"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_the_worker_disk_filling_mid_sync_says_so_and_loses_nothing(
    tiny_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_kernel.contracts.workspace import WorkerShares

    from .conftest import FAR, add_worker, close_plane, make_plane

    plane = make_plane(tmp_path, monkeypatch)
    add_worker(plane, "far", 1, WorkerShares(host=FAR))
    folder = notebook_folder(tmp_path)
    big = os.urandom(5 << 20)
    (folder / "weights.npy").write_bytes(big)
    km, kc = await start(folder)
    try:
        _, out = await run(kc, "print(6 * 7)")
        said = out if "gpulayer:" in out else await note(kc)
        assert "workspace_disk_full" in said or "is full" in said, said
        assert "weights.npy" in said
        assert (folder / "weights.npy").read_bytes() == big  # nothing lost here
        leftovers = [p for p in tiny_disk.rglob("*") if p.name.startswith(".gpulayer-tmp-")]
        assert leftovers == []  # nothing half-written there
        # leave it out, and the next cell has the rest
        (folder / ".gpulayerignore").write_text("*.npy\n")
        _, out = await run(kc, "import os\nprint(open('data.csv').read().count(','))")
        assert out.split()[0] == "3"
        _, out = await run(kc, "print(os.path.exists('weights.npy'))")
        assert out.strip() == "False"  # synced without it, and nothing more to say
    finally:
        await stop(km, kc)
        close_plane(plane)


async def test_two_kernels_on_two_workers_writing_one_file_keep_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_kernel.contracts.workspace import WorkerShares

    from .conftest import add_worker, close_plane, make_plane

    plane = make_plane(tmp_path, monkeypatch)
    add_worker(plane, "far-a", 1, WorkerShares(host="machine-a"))
    add_worker(plane, "far-b", 1, WorkerShares(host="machine-b"))
    folder = notebook_folder(tmp_path)
    a_km, a = await start(folder)
    b_km, b = await start(folder)
    try:
        sessions = plane.call(plane.cp.list_sessions())
        assert {s.job.placement.nodes[0].worker_name for s in sessions} == {"far-a", "far-b"}
        # Both cells run at once: b's started before a's file came back to the folder.
        started, go = tmp_path / "started", tmp_path / "go"
        slow_b = asyncio.ensure_future(
            run(b, gated(started, go, "open('results.csv', 'w').write('from b')"))
        )
        await until(started.exists, 60, what="b's cell to run on its worker")
        await run(a, "open('results.csv', 'w').write('from a')")
        results = folder / "results.csv"
        await until(lambda: results.exists(), 20)
        go.touch()
        _, out = await slow_b
        said = out if "gpulayer:" in out else await note(b)
        assert "results.csv changed here and on the worker" in said
        assert results.read_text() == "from a"  # the first one's stays
        assert (folder / "results.worker-1.csv").read_text() == "from b"  # the second's beside
    finally:
        await stop(a_km, a)
        await stop(b_km, b)
        close_plane(plane)
