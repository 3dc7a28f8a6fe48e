"""The Jupyter host's change detection around a cell's outputs: a file the user saves while the
cell's outputs are written back is news for the next cell, and the outputs themselves are not.

The worker's side is played in memory (``Worker`` below: the answers the host's calls get), so
the moment of the save is exact: between the host's collect and its write-back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpulayer_kernel.contracts.workspace import FileEntry, WorkspaceAnswer, WorkspaceCall
from gpulayer_kernel.workspace import pack as packs
from gpulayer_kernel.workspace.host import HostWorkspace
from gpulayer_kernel.workspace.index import digest_of


class Worker:
    """What a worker answers to one session's workspace calls, kept in memory."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.syncs: list[list[str]] = []  # the paths each sync put
        self.outputs: dict[str, bytes] = {}  # what the next collect brings back
        self.before_answer: Callable[[], object] = lambda: None  # as a collect is answered

    async def view(self, session_id: str) -> None:
        return None

    async def missing(self, digests: list[str]) -> list[str]:
        return [d for d in digests if d not in self.objects]

    async def put_pack(self, blob: bytes) -> None:
        self.objects.update(packs.unpack(blob))

    async def read_pack(self, digests: list[str]) -> bytes:
        return packs.pack((d, self.objects[d]) for d in digests)

    async def call(self, session_id: str, call: WorkspaceCall, wait: float) -> WorkspaceAnswer:
        if call.op == "sync":
            assert call.delta is not None
            self.syncs.append(sorted(e.path for e in call.delta.put))
            return WorkspaceAnswer(id=call.id, version=call.delta.version)
        outputs = []
        for name, body in self.outputs.items():
            self.objects[digest_of(body)] = body
            outputs.append(FileEntry(path=name, size=len(body), digest=digest_of(body)))
        self.outputs = {}
        self.before_answer()
        return WorkspaceAnswer(id=call.id, version=len(self.syncs), outputs=outputs)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    pytest.importorskip("inotify_simple", reason="without inotify every cell looks at every file")
    root = tmp_path / "nb"
    root.mkdir()
    (root / "helpers.py").write_text("VALUE = 1\n")
    return root


async def test_a_file_saved_while_outputs_come_back_goes_with_the_next_cell(
    folder: Path,
) -> None:
    worker = Worker()
    ws = HostWorkspace(folder, "s1", worker)
    try:
        await ws.before_cell()  # the first cell: the whole folder
        assert worker.syncs == [["helpers.py"]]

        # The cell wrote results.csv; the user saves helpers.py (same size) as it comes back.
        worker.outputs = {"results.csv": b"x\n1\n"}
        worker.before_answer = lambda: (folder / "helpers.py").write_text("VALUE = 2\n")
        assert await ws.after_cell() is None
        assert (folder / "results.csv").read_bytes() == b"x\n1\n"

        await ws.before_cell()
        assert worker.syncs == [["helpers.py"], ["helpers.py"]]  # the save, not the cell's output
        assert worker.objects[ws.synced[b"helpers.py"]] == b"VALUE = 2\n"
        await ws.before_cell()
        assert len(worker.syncs) == 2  # nothing changed since: nothing sent
    finally:
        ws.close()
