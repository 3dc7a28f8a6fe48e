"""A 2-rank session of ``%%gpulayer`` cells in a real kernel, on a served worker that does not
see the notebook's folder: both ranks read data.csv and import helpers.py from a synced copy, an
edit of helpers.py reaches both before the next cell, and what rank 0 writes comes back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until
from tests.jupyter.conftest import Kernel, kernel_env

from .conftest import notebook_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[Kernel, Path]]:
    from jupyter_client.manager import start_new_kernel

    server = ServeProcess(tmp_path / "cp").start()
    worker = WorkerProcess(
        server.url,
        server.create_token("join"),
        name="far",
        simulate_gpus=2,
        home=tmp_path / "far",
        args=("--host-id", "another-machine"),
        env={"GPULAYER_SESSION_PRELOAD": ""},
    ).start()
    folder = notebook_folder(tmp_path)
    env = {**kernel_env(tmp_path / "k"), **server.client_env(), "GPULAYER_SESSION_PRELOAD": ""}
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(folder))
    try:
        yield Kernel(km, kc), folder
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        km.cleanup_resources()
        worker.stop()
        server.stop()


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_both_ranks_of_a_session_see_the_workspace(kernel: tuple[Kernel, Path]) -> None:
    k, folder = kernel
    assert k.run("%load_ext gpulayer_kernel").ok
    started = k.run("%gpulayer session start --name ddp --gpus 2", timeout=120)
    assert started.ok, plain(started.stream())
    cell = (
        "%%gpulayer\nimport os, helpers\n"
        "print(os.environ['RANK'], open('data.csv').read().count(','), helpers.VALUE, "
        "os.getcwd() == " + repr(str(folder)) + ")"
    )
    first = k.run(cell, timeout=120)
    assert first.ok, plain(first.stream())
    lines = sorted(plain(first.stream("stdout")).strip().splitlines())
    assert lines == ["[rank 0] 0 3 1 False", "[rank 1] 1 3 1 False"]  # a copy, on both ranks

    (folder / "helpers.py").write_text("VALUE = 7\n")
    second = k.run(
        "%%gpulayer\nimport importlib, os\nimportlib.reload(helpers)\nprint(helpers.VALUE)\n"
        "if os.environ['RANK'] == '0':\n    open('results.csv', 'w').write('rank0')",
        timeout=120,
    )
    assert second.ok, plain(second.stream())
    lines = sorted(plain(second.stream("stdout")).strip().splitlines())
    assert lines == ["[rank 0] 7", "[rank 1] 7"]
    # A session cell's outputs are back when the cell returns.
    wait_until(lambda: (folder / "results.csv").exists(), 10)
    assert (folder / "results.csv").read_text() == "rank0"
