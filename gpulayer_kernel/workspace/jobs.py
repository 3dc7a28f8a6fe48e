"""A one-shot job in its notebook's folder (ADR 0022): the worker's end.

A ``%%gpulayer`` cell's workload names the notebook's folder (``WorkspaceSource``). The worker
decides as the control plane decides for sessions (``plan.decide``, over what this worker
declared when it joined), with no request:

- **in place** (it sees the folder): the job runs there. Nothing is asked, copied or sent back;
  the job's own files (its cell, ``--in`` values) stay in its job folder (``GPULAYER_BUNDLE_DIR``):
  nothing of GPUlayer's is written into the user's folder.
- **synced** (it does not): the job runs in this worker's copy of the folder, one per user and
  folder (``<work root>/workspaces/<key>``), kept between jobs. Before the job starts, the copy is
  brought to the job's manifest (a digest in the control plane's store, the folder's files as
  they were at the submit): only the files it lacks are fetched, each verified by its digest; a
  file the code changed here since is moved aside, never overwritten. After the job, the files it
  wrote or changed go to the store for the job's owner (under the cap; bigger ones stay here,
  listed) and a record of them becomes an artifact of the job (``.gpulayer/workspace-n<node>.json``,
  one per node), which the notebook reads to write them back.
- **none** (an older worker's way, or a synced one without a manifest): the job runs in its own
  folder as before, and its log says why.

Two jobs of one folder on one worker at once share its copy, as they would share the folder in
place; syncs and collects take turns. A restarted worker forgets its copies (they are removed).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..contracts import Artifact, FinishReport
from ..contracts.workspace import (
    RECORD,
    CollectAsk,
    FileEntry,
    WorkerShares,
    WorkspaceAnswer,
    WorkspaceDelta,
    WorkspaceManifest,
    WorkspacePlan,
    WorkspaceSource,
)
from ..errors import GPUlayerError, ValidationFailed
from ..job.runner import BUNDLE_ENV
from . import pack as packs
from .names import clean_temporaries, name_of
from .plan import decide
from .remote import WorkerLink, WorkerWorkspace
from .scan import Rules
from .watch import Detector

log = logging.getLogger("gpulayer.workspace")

COPIES = "workspaces"  # under the work root
MAX_COPIES = 8  # folders copied on one worker; the least recently used goes first


class FolderCopy:
    """This worker's copy of one user's notebook folder, kept between that folder's jobs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ws: WorkerWorkspace | None = None
        self.lock = asyncio.Lock()
        self.manifest: str | None = None  # the manifest it holds
        self.files: dict[bytes, FileEntry] = {}  # that manifest's files, by name
        self.used = time.monotonic()
        self.busy = 0

    def _open(self, link: WorkerLink) -> WorkerWorkspace:
        if self.ws is None:
            self.root.mkdir(parents=True, exist_ok=True)
            clean_temporaries(self.root)
            ws = WorkerWorkspace("", link, self.root)
            ws.dir = self.root
            ws.rules = Rules(self.root)
            ws.detector = Detector(self.root, ws.rules)
            ws.detector.start()
            self.ws = ws
        self.ws.link = link
        return self.ws

    async def bring_up(self, job_id: str, link: WorkerLink, digest: str) -> list[str]:
        """Make the copy what the manifest ``digest`` says (only what it lacks is fetched)."""
        async with self.lock:
            ws = await asyncio.to_thread(self._open, link)
            ws.job_id = job_id
            if digest == self.manifest:
                return []  # the folder did not change since the last job: nothing to do
            files = await _manifest(link, job_id, digest)
            base = None if self.manifest is None else ws.version
            puts = [e for rel, e in files.items() if self.files.get(rel) != e]
            removes = [e for rel, e in self.files.items() if rel not in files]
            delta = WorkspaceDelta(
                base=base,
                version=ws.version + 1,
                put=puts,
                remove=removes if base is not None else [],
            )
            answer = await ws.sync(f"job-{job_id}", delta)
            self.manifest, self.files = digest, files
            return list(answer.notes)

    async def collect(self, job_id: str, link: WorkerLink, ask: CollectAsk) -> WorkspaceAnswer:
        """What the job wrote or changed: put in the store for its owner (under the cap)."""
        async with self.lock:
            ws = await asyncio.to_thread(self._open, link)
            ws.job_id = job_id
            return await ws.collect(f"job-{job_id}", ask)

    def close(self) -> None:
        if self.ws is not None and self.ws.detector is not None:
            self.ws.detector.close()


async def _manifest(link: WorkerLink, job_id: str, digest: str) -> dict[bytes, FileEntry]:
    """The manifest's files by name, each name checked (read for the job's owner only)."""
    got = dict(packs.unpack(await link.read_pack(job_id, [digest])))
    if digest not in got:
        raise GPUlayerError(
            f"the workspace manifest {digest[:12]}… of job {job_id} is not in the control "
            "plane's store for the job's owner",
            hint="run the cell again: the notebook sends it with each cell (a control plane "
            "that lost its store gets it again)",
            code="workspace_manifest_missing",
        )
    try:
        manifest = WorkspaceManifest.model_validate_json(got[digest])
    except ValueError as exc:
        raise ValidationFailed(
            f"the workspace manifest of job {job_id} is not valid: {exc}",
            hint="it is made by the notebook's GPUlayer; upgrade both sides to the same version",
            code="workspace_manifest_invalid",
        ) from None
    return {name_of(e): e for e in manifest.files}


class Copies:
    """A worker's folder copies, by folder (one registry per work root in this process)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.copies: OrderedDict[str, FolderCopy] = OrderedDict()
        self._swept = False

    def get(self, owner: str, source: WorkspaceSource) -> FolderCopy:
        key = hashlib.sha256(f"{owner}\0{source.host}\0{source.folder}".encode()).hexdigest()
        if not self._swept:
            self._swept = True
            self._sweep()
        copy = self.copies.get(key[:24])
        if copy is None:
            copy = self.copies[key[:24]] = FolderCopy(self.root / key[:24])
            self._evict()
        self.copies.move_to_end(key[:24])
        copy.used = time.monotonic()
        return copy

    def _sweep(self) -> None:
        """Copies left by this worker's last run (their state is unknown here): gone, off the
        job's path (renamed now, removed in a thread)."""
        if not self.root.exists():
            return
        old = self.root.with_name(f"{self.root.name}.old-{os.getpid()}-{time.time_ns()}")
        try:
            self.root.rename(old)
        except OSError:
            return
        asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, old, True)

    def _evict(self) -> None:
        idle = [k for k, c in self.copies.items() if not c.busy and not c.lock.locked()]
        while len(self.copies) > MAX_COPIES and idle:
            key = idle.pop(0)
            copy = self.copies.pop(key)
            copy.close()
            shutil.rmtree(copy.root, ignore_errors=True)


_COPIES: dict[Path, Copies] = {}


def copies_of(work_root: Path) -> Copies:
    found = _COPIES.get(work_root)
    if found is None:
        found = _COPIES[work_root] = Copies(work_root / COPIES)
    return found


class JobWorkspace:
    """One attempt of one one-shot job (on one node), in its notebook's folder."""

    def __init__(
        self,
        job_id: str,
        owner: str,
        node: int,
        source: WorkspaceSource,
        *,
        worker: str,
        shares: WorkerShares | None,
        in_process: bool,
        link: Callable[[], WorkerLink],
        put_blob: Callable[[bytes], Awaitable[str]],
        work_root: Path,
    ) -> None:
        self.job_id, self.owner, self.node, self.source = job_id, owner, node, source
        self.plan: WorkspacePlan = decide(source, shares, worker=worker, in_process=in_process)
        self._link, self._put_blob = link, put_blob
        self.work_root = work_root
        self.copy: FolderCopy | None = None  # synced: the copy it runs in
        self.unsent = False  # synced, but the cell sent no manifest (its record says so)

    async def prepare(self, cwd: Path, env: dict[str, str], system: Callable[[str], None]) -> Path:
        """Where the job runs (``cwd`` when there is no workspace); sets ``env``'s variables.
        A synced copy that cannot be made raises (the job fails saying why; nothing is lost)."""
        plan, source = self.plan, self.source
        if plan.mode == "in_place" and plan.path:
            where = Path(plan.path)
            if not where.is_dir():
                system(f"no workspace: {where} is not a folder on this worker")
                return cwd
        elif plan.mode == "synced" and (source.manifest is not None or source.pull):
            copy = copies_of(self.work_root).get(self.owner, source)
            copy.busy += 1
            try:
                if source.manifest is not None:
                    for note in await copy.bring_up(self.job_id, self._link(), source.manifest):
                        system(note)
            except BaseException:
                copy.busy -= 1
                raise
            self.copy = copy
            where = copy.root
        else:
            self.unsent = plan.mode == "synced"
            words = " (the cell sent no copy of the folder; the next one does)" * self.unsent
            system(f"no workspace: {plan.reason}{words}")
            return cwd
        env[BUNDLE_ENV] = str(cwd)  # the job's own files stay where they are
        return where

    async def finish(self, report: FinishReport) -> FinishReport:
        """(Synced.) The job's outputs into the store, their record an artifact of the job."""
        if self.copy is None and not self.unsent:
            return report
        answer = WorkspaceAnswer(
            id=f"job-{self.job_id}",
            ok=False,
            code="workspace_no_manifest",
            error=f"{self.plan.reason}: the cell sent no copy of the folder",
        )
        if self.copy is not None:
            try:
                answer = await self.copy.collect(self.job_id, self._link(), _ask(self.source))
            except Exception as exc:  # the job's own outcome stands; the record says why
                log.warning("workspace outputs of job %s: %r", self.job_id, exc)
                answer = WorkspaceAnswer(
                    id=f"job-{self.job_id}",
                    ok=False,
                    code=getattr(exc, "code", None) or "workspace_failed",
                    error=f"the outputs did not come back: {getattr(exc, 'message', exc)}",
                )
            finally:
                self.copy.busy -= 1
        data = answer.model_dump_json().encode()
        try:
            digest = await self._put_blob(data)
        except GPUlayerError as exc:
            log.warning("workspace record of job %s: %s", self.job_id, exc.message)
            return report
        record = Artifact(digest=digest, size=len(data), name=RECORD.format(node=self.node))
        return report.model_copy(update={"artifacts": [*report.artifacts, record]})


def _ask(source: WorkspaceSource) -> CollectAsk:
    """What comes back: changed files under the notebook's cap, or the ones it pulls."""
    ask = CollectAsk() if source.cap is None else CollectAsk(cap=source.cap)
    if source.pull:
        return ask.model_copy(update={"paths": source.pull, "cap": 1 << 62, "total": 1 << 62})
    return ask
