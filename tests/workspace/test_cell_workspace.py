"""One-shot ``%%gpulayer`` cells in the notebook's folder, in a real kernel on ``gpulayer serve``:
on a worker that does not see the folder (``--host-id``: a copy, only what it lacks is sent, the
outputs back, big ones pulled, both sides' edits kept), and on one that does (in place, nothing
of GPUlayer's written into the folder)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until
from tests.jupyter.conftest import Kernel, kernel_env

from .conftest import gated, notebook_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def own(text: str) -> str:
    """The cell's own output, without GPUlayer's lines (placed on, submitted, succeeded)."""
    return "".join(
        line for line in plain(text).splitlines(True) if not line.startswith("gpulayer:")
    )


def served(
    tmp_path: Path, *worker_args: str, **worker_env: str
) -> tuple[ServeProcess, WorkerProcess]:
    server = ServeProcess(tmp_path / "cp").start()
    worker = WorkerProcess(
        server.url,
        server.create_token("join"),
        name="far" if worker_args else "near",
        simulate_gpus=1,
        home=tmp_path / "worker",
        args=worker_args,
        env=dict(worker_env),
    ).start()
    return server, worker


def kernel_in(folder: Path, tmp_path: Path, server: ServeProcess, **env: str) -> Kernel:
    from jupyter_client.manager import start_new_kernel

    full = {**kernel_env(tmp_path / "k"), **server.client_env(), **env}
    km, kc = start_new_kernel(kernel_name="python3", env=full, cwd=str(folder))
    k = Kernel(km, kc)
    assert k.run("%load_ext gpulayer_kernel").ok
    return k


def close(k: Kernel) -> None:
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=False)
    k.km.cleanup_resources()


@pytest.fixture
def far(tmp_path: Path) -> Iterator[tuple[Kernel, Path, ServeProcess, WorkerProcess]]:
    server, worker = served(tmp_path, "--host-id", "another-machine")
    folder = notebook_folder(tmp_path)
    k = kernel_in(folder, tmp_path, server, GPULAYER_WORKSPACE_BACK_BYTES="1000")
    try:
        yield k, folder, server, worker
    finally:
        close(k)
        worker.stop()
        server.stop()


def test_a_cell_on_a_worker_without_the_disk_gets_the_folder_and_gives_outputs_back(
    far: tuple[Kernel, Path, ServeProcess, WorkerProcess],
) -> None:
    k, folder, _, worker = far
    first = k.run(
        "%%gpulayer\nimport os, helpers\n"
        "print(open('data.csv').read().count(','), helpers.VALUE, os.getcwd())",
        timeout=120,
    )
    assert first.ok, plain(first.stream())
    commas, value, where = own(first.stream("stdout")).split()
    assert (commas, value) == ("3", "1")
    assert where != str(folder) and where.startswith(str(worker.home / "work" / "workspaces"))

    (folder / "helpers.py").write_text("VALUE = 7\n")  # a new process each cell: no reload
    second = k.run(
        "%%gpulayer\nimport helpers\nopen('results.csv', 'w').write(f'v,{helpers.VALUE}')\n"
        "helpers.VALUE",
        timeout=120,
    )
    assert second.ok, plain(second.stream())
    assert second.result_text() == "7"
    assert (folder / "results.csv").read_text() == "v,7"  # back when the cell returns

    # The same copy next time: only the edit travelled, and the copy holds the output too.
    copy = Path(where)
    assert (copy / "results.csv").read_text() == "v,7" and (copy / "helpers.py").exists()
    # Nothing of GPUlayer's in the notebook's folder: no cell.py, no record, no temporaries.
    assert sorted(p.name for p in folder.iterdir()) == [
        "analysis.ipynb",
        "data.csv",
        "helpers.py",
        "results.csv",
    ]


def test_a_big_output_stays_on_the_worker_until_pulled_and_both_edits_are_kept(
    far: tuple[Kernel, Path, ServeProcess, WorkerProcess],
) -> None:
    k, folder, _, _ = far
    big = k.run("%%gpulayer\nopen('big.bin', 'wb').write(b'x' * 5000)\nNone", timeout=120)
    assert big.ok, plain(big.stream())
    said = plain(big.stream("stderr"))
    assert "left on worker far (over 1000 B): big.bin (4.9 KiB)" in said, said
    assert "%gpulayer pull big.bin" in said and not (folder / "big.bin").exists()
    pulled = k.run("%gpulayer pull big.bin", timeout=120)
    assert pulled.ok, plain(pulled.stream())
    assert (folder / "big.bin").read_bytes() == b"x" * 5000
    assert "pulled big.bin from worker far" in plain(pulled.stream())

    # The cell rewrites out.txt on the worker while the user edits it here: both are kept.
    (folder / "out.txt").write_text("first")
    started, go = folder.parent / "started", folder.parent / "go"
    code = gated(started, go, "open('out.txt', 'w').write('worker')")
    msg = k.kc.execute(f"%%gpulayer\n{code}", allow_stdin=False)
    wait_until(started.exists, 120, what="the cell to run on the worker")
    (folder / "out.txt").write_text("my edit")
    go.touch()
    while True:
        reply = k.kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg:
            break
    assert reply["content"]["status"] == "ok", reply["content"]
    assert (folder / "out.txt").read_text() == "my edit"  # never silently overwritten
    assert (folder / "out.worker-1.txt").read_text() == "worker"


def test_a_cell_on_a_worker_that_sees_the_folder_runs_in_it_and_writes_nothing_of_ours(
    tmp_path: Path,
) -> None:
    server, worker = served(tmp_path, GPULAYER_WARM_RUNNER="0")  # the cold path writes files
    folder = notebook_folder(tmp_path)
    k = kernel_in(folder, tmp_path, server)
    try:
        # An --in value JSON cannot carry travels as a file in the job's bundle: read from the
        # job's own folder, never written into the notebook's (nor is the cell's source).
        assert k.run("import numpy as np\nshipped = np.arange(3.0)").ok
        cell = k.run(
            "%%gpulayer --in shipped\nimport os, helpers\nopen('results.csv', 'w').write('done')\n"
            "(os.getcwd(), helpers.VALUE, float(shipped.sum()))",
            timeout=120,
        )
        assert cell.ok, plain(cell.stream())
        assert cell.result_text().split() == repr([str(folder), 1, 3.0]).split()
        assert (folder / "results.csv").read_text() == "done"  # written there, by the job
        plain_cell = k.run("%%gpulayer\n6 * 7", timeout=120)  # its text alone: from memory
        assert plain_cell.ok and plain_cell.result_text() == "42", plain(plain_cell.stream())
        names = {p.name for p in folder.iterdir()}
        assert names == {"analysis.ipynb", "data.csv", "helpers.py", "results.csv", "__pycache__"}
        assert not (worker.home / "work" / "workspaces").exists()  # nothing copied
    finally:
        close(k)
        worker.stop()
        server.stop()
