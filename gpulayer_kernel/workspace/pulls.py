"""Files too big to come back on their own: ``%gpulayer pull PATH`` and ``gpulayer pull``.

Outputs over the cap stay on the worker and are listed after the cell. Three ways fetch them:

- ``gpulayer pull SESSION PATH...`` on the Jupyter host (a terminal): asks the session's worker
  for those files whatever their size and writes them into the notebook's folder, with progress
  (:func:`pull_files`);
- ``%gpulayer pull PATH`` in a kernel whose ``%%gpulayer`` cells run in a session: the same,
  from the kernel (it runs on the Jupyter host);
- ``%gpulayer pull PATH`` inside a GPU kernel (it runs on the worker): it cannot reach the
  notebook's folder itself, so it asks for the file (``.gpulayer/pull`` in the workspace) and
  the file comes back at the end of that cell, whatever its size (:func:`ask_from_inside`);
- ``%gpulayer pull PATH`` after one-shot ``%%gpulayer`` cells: a small job on the worker that
  kept the file sends it from its copy of the folder, whatever its size (:func:`pull_after_cells`).

A file changed here since it was last synced is never overwritten: the worker's copy lands
beside it (``model.worker-1.pt``), as after a cell.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

from ..display import human_bytes
from .cells import Bridge
from .host import HostWorkspace, WorkspaceLink

if TYPE_CHECKING:
    from ..contracts import Job, JobSpec

WANTED = ".gpulayer/pull"  # in a synced workspace: files to send back whatever their size
MODE_ENV = "GPULAYER_WORKSPACE"  # in a job: in_place, synced (set by the worker)


def is_file_name(text: str) -> bool:
    """``model.pt`` or ``out/x`` is a file; ``x,y`` names variables (``%gpulayer pull x,y``)."""
    return not all(part.strip().isidentifier() for part in text.split(",") if part.strip())


def ask_from_inside(paths: list[str], cwd: str | None = None) -> str:
    """(In a GPU kernel on its worker.) Ask for ``paths`` to come back after this cell."""
    mode = os.environ.get(MODE_ENV)
    if mode == "in_place":
        return f"{', '.join(paths)}: already in the notebook's folder (this kernel runs in it)"
    if mode != "synced":
        return "this kernel has no synced workspace: nothing to pull (docs/workspace.md)"
    root = Path(cwd or os.getcwd())
    sizes = []
    for p in paths:
        f = root / p
        if not f.is_file():
            sizes.append(f"{p}: no such file here")
            continue
        sizes.append(f"{p} ({human_bytes(f.stat().st_size)})")
    wanted = root / WANTED
    wanted.parent.mkdir(exist_ok=True)
    with open(wanted, "a") as out:
        out.writelines(p + "\n" for p in paths)
    return f"coming back to the notebook's folder at the end of this cell: {', '.join(sizes)}"


def progress_line(stream: TextIO | None = None) -> Callable[[int, int], None]:
    """A progress callback that redraws one line (``\\r``)."""
    out = stream or sys.stderr

    def show(done: int, total: int) -> None:
        pct = 100 * done // total if total else 100
        end = "\n" if done >= total else ""
        line = f"\rpulling: {human_bytes(done)} of {human_bytes(total)} ({pct}%)"
        print(line, end=end, file=out, flush=True)

    return show


async def pull_files(
    link: WorkspaceLink,
    session_id: str,
    paths: list[str],
    progress: Callable[[int, int], None] | None = None,
    engine: HostWorkspace | None = None,
) -> str:
    """Fetch ``paths`` from a synced session's worker into its notebook's folder."""
    from ..errors import InvalidInput

    own = engine is None
    if engine is None:
        view = await link.view(session_id)
        if view is None or view.mode != "synced" or not view.folder:
            mode = "no workspace" if view is None else f"{view.mode.replace('_', ' ')}"
            raise InvalidInput(
                f"session {session_id} has {mode}: there is nothing to pull",
                hint="in place, the files are in the notebook's folder already",
                code="workspace_not_synced",
            )
        engine = HostWorkspace(Path(view.folder), session_id, link)
        engine.version = max(engine.version, 1)  # pulling needs no sync first
    try:
        words = await engine.pull(paths, progress)
    finally:
        if own:
            engine.close()
    return words or f"pulled into {engine.root}: {', '.join(paths)}"


class Submitter(Bridge, Protocol):
    """What a pull needs of the kernel's bridge besides ``call``."""

    def upload_bundle(self, digest: str, data: bytes) -> bool: ...
    def submit(self, spec: JobSpec) -> Job: ...
    def wait(self, job_id: str, timeout: float | None = None) -> Job: ...


PULL_CELL = b"# %gpulayer pull: the worker sends the files named in the job's workspace\nNone\n"


def left_by_cells() -> bool:
    """Whether a one-shot cell of this kernel's folder left files on a worker."""
    from .cells import here
    from .cellsync import _FOLDERS

    source = here()
    return source is not None and any(
        f.get(source.folder) is not None and f[source.folder].big for f in _FOLDERS.values()
    )


def pull_after_cells(bridge: Submitter, paths: list[str]) -> str:
    """``%gpulayer pull PATH...`` after one-shot cells: from each worker that kept one of
    them, a small job sends them whatever their size; they land in the folder."""
    from .. import bundles
    from ..contracts import JobSpec, PythonWorkload, Resources
    from .cells import CellRun, here
    from .cellsync import _FOLDERS

    source = here()
    folder = next(
        (f[source.folder] for f in list(_FOLDERS.values()) if source and source.folder in f),
        None,
    )
    if source is None or folder is None:
        return "no one-shot cell of this notebook left files on a worker: nothing to pull"
    by: dict[str, list[str]] = {}
    unknown = []
    for p in paths:
        worker = folder.big.get(p)
        if worker is None:
            unknown.append(p)
        else:
            by.setdefault(worker, []).append(p)
    words = [f"{p}: not among the files left on a worker (see the cells' notes)" for p in unknown]
    digest, data = bundles.build({"cell.py": PULL_CELL})
    for worker, names in by.items():
        bridge.upload_bundle(digest, data)
        ws = source.model_copy(update={"pull": names, "manifest": None})
        spec = JobSpec(
            name="pull",
            workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py", workspace=ws),
            resources=Resources(worker=worker),
        )
        job = bridge.wait(bridge.submit(spec).id)
        run = CellRun(spec, folder, folder.base)
        words += (run.finish(bridge, job) or "").splitlines() or [
            f"{', '.join(names)}: nothing came back from worker {worker} ({job.state.value}"
            f"{': ' + job.reason if job.reason else ''})"
        ]
        for n in names:
            if (folder.root / n).exists():
                words.append(f"pulled {n} from worker {worker}")
    return "\n".join(w.removeprefix("gpulayer: ") for w in words)
