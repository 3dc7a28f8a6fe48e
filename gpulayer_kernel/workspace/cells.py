"""One-shot ``%%gpulayer`` cells in the notebook's folder (ADR 0022): the Jupyter host's end.

The magic builds its JobSpec, then :func:`prepare` names the kernel's folder on its workload
(``WorkspaceSource``). A worker that sees the folder runs the cell in it: nothing is sent,
asked or written back, and deciding costs the worker nothing (``jobs.py``). Only when a worker
that does not see it may take the job (the fleet as its workers declared it, looked at once per
``FLEET_TTL``) does the folder ride along, as a manifest: the files the control plane's store
lacks for this user go first (zstd packs), then the manifest itself, and the job carries its
digest. A :class:`CellFolder` per folder keeps the manifest current through the change
detector: a cell after no change sends nothing and costs microseconds, after an edit only that
file goes.

After the job, ``cellsync.bring_back`` reads each node's record (an artifact of the job), fetches
the outputs and writes them into the folder, never over a file changed here since the job's
manifest: that one stays, the worker's lands beside it. Bigger outputs stay in the worker's copy,
listed with the ``%gpulayer pull`` that fetches them (``pulls.pull_after_cells``).

This module is the fast path and imports nothing heavy (the magic loads it with the extension);
``cellsync.py`` does the sending and the writing back, loaded when there is some.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..codes import ErrorCode
from ..contracts import Job, JobSpec, WorkerInfo
from ..contracts.workspace import RECORD_PREFIX, WorkspaceSource
from ..errors import GPUlayerError
from .plan import BACK_ENV, decide, host_id

if TYPE_CHECKING:
    from .cellsync import CellFolder

FLEET_TTL = 10.0  # seconds the fleet's declarations are trusted before they are read again
T = TypeVar("T")


class Bridge(Protocol):
    """The kernel's bridge to its control plane (``jupyter/bridge.py``)."""

    def call(self, fn: Callable[[Any], Awaitable[T]], timeout: float | None = None) -> T: ...


@dataclass
class CellRun:
    """One cell's workspace: the spec to submit, and what its outputs are written against."""

    spec: JobSpec
    folder: CellFolder | None = None  # a manifest rode with the job
    base: Mapping[bytes, str] = field(default_factory=dict)  # that manifest's digests
    words: list[str] = field(default_factory=list)  # said before the submit

    def said(self) -> str | None:
        return _lines(self.words)

    def finish(self, bridge: Bridge, job: Job) -> str | None:
        """(The job ended.) Its outputs into the folder; the words for the cell's output."""
        if not _records(job):
            return None  # in place, or no workspace: nothing came back
        if self.folder is None:  # a worker copies folders after all: the next cell sends it
            _FLEETS.clear()
            return None
        return _lines(bridge.call(lambda s: self._back(s, job)))

    async def _back(self, s: Any, job: Job) -> list[str]:
        from .cellsync import bring_back

        assert self.folder is not None
        cap = getattr(self.spec.workload, "workspace", None)
        words, copied = await bring_back(
            s, job, _records(job), self.folder, self.base, cap.cap if cap else None
        )
        if copied:
            _FLEETS.clear()  # a worker copies this folder after all: the next cell sends it
        return words

    def later(self, bridge: Bridge, job_id: str) -> None:
        """(``--no-wait``.) The same when the job ends, from the bridge's loop."""
        if self.folder is None:
            return  # (a worker that copies folders is seen at the next look at the fleet)

        async def start(s: Any) -> None:
            task = asyncio.ensure_future(_when_done(s, job_id, self))
            _LATER.add(task)
            task.add_done_callback(_LATER.discard)

        bridge.call(start)


_LATER: set[asyncio.Task[None]] = set()


async def _when_done(s: Any, job_id: str, run: CellRun) -> None:
    try:
        job = await s.wait(job_id, None)
        words = await run._back(s, job) if _records(job) else []
    except Exception as exc:
        words = [f"outputs of job {job_id} did not come back: {exc}"]
    said = _lines(words)
    if said:
        print(f"job {job_id}:\n{said}", end="", file=sys.stderr)


# -- before the submit -----------------------------------------------------------------------------


_SOURCE: tuple[str, str, WorkspaceSource] | None = None


def here() -> WorkspaceSource | None:
    """The kernel's folder (the notebook's, as Jupyter starts kernels) on this host."""
    global _SOURCE
    try:
        folder, host = os.getcwd(), host_id()
    except OSError:  # the folder was removed under the kernel
        return None
    if _SOURCE is None or _SOURCE[:2] != (folder, host):
        _SOURCE = (folder, host, WorkspaceSource(folder=folder, host=host))
    return _SOURCE[2]


@dataclass
class _Fleet:
    at: float
    workers: list[WorkerInfo] | None  # None: unknown (its listing was refused)

    def syncs(self, source: WorkspaceSource, only: str | None) -> bool:
        """Whether a worker that could take the job would copy the folder."""
        if self.workers is None:
            return True
        for w in self.workers:
            if not w.live or (only is not None and w.name != only):
                continue
            plan = decide(source, w.shares, worker=w.name, in_process=w.transport == "inprocess")
            if plan.mode == "synced":
                return True
        return False


_FLEETS: weakref.WeakKeyDictionary[Any, _Fleet] = weakref.WeakKeyDictionary()


def prepare(bridge: Bridge, spec: JobSpec, *, files: bool = False) -> CellRun:
    """``spec`` run in the kernel's folder: in place where a worker sees it, with its manifest
    when one that does not may take the job. Costs microseconds when nothing is to be sent.
    A cell with ``--files`` runs among them, as before (no workspace)."""
    source = None if files else here()
    if source is None:
        return CellRun(spec)
    fleet = _FLEETS.get(bridge)
    only = spec.resources.worker
    if fleet is not None and time.monotonic() - fleet.at < FLEET_TTL:
        if not fleet.syncs(source, only):
            return CellRun(with_source(spec, source))
    return bridge.call(lambda s: _prepare(bridge, s, spec, source))


async def _prepare(bridge: Bridge, s: Any, spec: JobSpec, source: WorkspaceSource) -> CellRun:
    fleet = _FLEETS.get(bridge)
    if fleet is None or time.monotonic() - fleet.at >= FLEET_TTL:
        try:
            workers: list[WorkerInfo] | None = list(await s.workers())
        except GPUlayerError:
            workers = None
        fleet = _FLEETS[bridge] = _Fleet(time.monotonic(), workers)
    if not fleet.syncs(source, spec.resources.worker):
        return CellRun(with_source(spec, source))
    from .cellsync import folder_of

    folder = folder_of(s, source)
    try:
        digest, base, notes = await folder.manifest()
    except GPUlayerError as exc:
        if exc.code != ErrorCode.WORKSPACE_TOO_BIG:
            raise
        return CellRun(with_source(spec, source), words=[f"the workspace was not synced: {exc}"])
    cap = os.environ.get(BACK_ENV, "")
    more = {"manifest": digest, "cap": int(cap) if cap.isdigit() else None}
    return CellRun(with_source(spec, source.model_copy(update=more)), folder, base, notes)


def with_source(spec: JobSpec, source: WorkspaceSource) -> JobSpec:
    workload = spec.workload.model_copy(update={"workspace": source})
    return spec.model_copy(update={"workload": workload})


def _records(job: Job) -> list[Any]:
    return sorted(
        (a for a in job.artifacts if a.name.startswith(RECORD_PREFIX)), key=lambda a: a.name
    )


def _lines(words: list[str]) -> str | None:
    lines = [w if w.startswith("gpulayer:") else f"gpulayer: {w}" for w in words]
    return "\n".join(lines) + "\n" if lines else None
