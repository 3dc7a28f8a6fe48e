"""The worker's end of a workspace: the folder a session's ranks (or its kernel) run in.

The executor asks the control plane for the plan when the session starts. *In place*: the ranks
run in the notebook's folder as this worker sees it; nothing is copied, nothing comes back (it
is already there). *Synced*: a folder of its own under the work root, filled and refreshed by
the Jupyter host's calls, which :meth:`WorkerWorkspace.serve` long-polls for:

- ``sync``: a delta on the version held here (another base: ``need_full``, and the host sends
  the whole). Objects this folder lacks come from the control plane in packs, each verified by
  its digest, each file written to a temporary name and renamed over its target (a reader sees
  the old content or the new). A file the code changed here since the last sync is moved aside
  first (``x.worker-1.csv``), never overwritten; removals touch only files nobody changed.
- ``collect``: the files the code wrote or changed since the last sync (a scan through the
  mtime index: only changed files are read), those under the cap put in the store for the
  session's owner and listed; bigger ones only listed (``big``), until a ``pull`` names them.

An answer is kept by call id: a call sent again (a restarted control plane, a lost answer) gets
the same answer, never a second application.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

from ..contracts.workspace import (
    CollectAsk,
    FileEntry,
    WorkspaceAnswer,
    WorkspaceCall,
    WorkspaceCalls,
    WorkspaceDelta,
    WorkspacePlan,
)
from ..errors import GPUlayerError
from . import pack as packs
from .index import Index, Known
from .names import (
    DiskFull,
    checked,
    clean_temporaries,
    move_aside,
    name_of,
    remove_inside,
    shown,
    write_inside,
)
from .scan import Caps, Notes, Rules
from .tree import entry, look, survey
from .watch import Detector

log = logging.getLogger("gpulayer.workspace")

KEPT_ANSWERS = 64
POLL = 25.0


class WorkerLink(Protocol):
    """The worker's workspace calls on the control plane, for one job."""

    async def plan(self, job_id: str) -> WorkspacePlan | None: ...
    async def calls(self, job_id: str, wait: float) -> WorkspaceCalls: ...
    async def answer(self, job_id: str, answer: WorkspaceAnswer) -> None: ...
    async def read_pack(self, job_id: str, digests: list[str]) -> bytes: ...
    async def put_pack(self, job_id: str, blob: bytes) -> None: ...


class WorkerWorkspace:
    """One session attempt's workspace on this worker."""

    def __init__(self, job_id: str, link: WorkerLink, scratch: Path) -> None:
        self.job_id = job_id
        self.link = link
        self.scratch = scratch  # a synced workspace's folder
        self.plan: WorkspacePlan | None = None
        self.dir: Path | None = None
        self.version = 0
        self.synced: dict[bytes, str] = {}
        self.index = Index()
        self._answers: OrderedDict[str, WorkspaceAnswer] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.note: str | None = None
        # What the code changed since the last collect (inotify): a collect after a cell that
        # wrote nothing costs microseconds, not a walk of the folder.
        self.detector: Detector | None = None
        self.rules: Rules | None = None

    async def prepare(self) -> Path | None:
        """The folder the ranks run in (None: the scratch folder as before, and why in
        ``note``)."""
        try:
            self.plan = await self.link.plan(self.job_id)
        except GPUlayerError as exc:
            self.note = f"no workspace: {exc.message}"
            return None
        if self.plan is None:
            return None
        if self.plan.mode == "in_place" and self.plan.path:
            path = Path(self.plan.path)
            if not path.is_dir():
                self.note = f"no workspace: {path} is not a folder on this worker"
                return None
            self.dir = path
        elif self.plan.mode == "synced":
            self.scratch.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(clean_temporaries, self.scratch)
            self.dir = self.scratch
            self.rules = Rules(self.scratch)
            self.detector = Detector(self.scratch, self.rules)
            self.detector.start()
            self._task = asyncio.create_task(self.serve())
        else:
            self.note = f"no workspace: {self.plan.reason}"
        return self.dir

    async def close(self) -> None:
        if self.detector is not None:
            self.detector.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # -- the calls ---------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Answer the Jupyter host's calls until the session ends (cancelled by ``close``)."""
        tries = 0
        while True:
            try:
                page = await self.link.calls(self.job_id, POLL)
                tries = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("workspace of %s: calls unreachable (%s)", self.job_id, exc)
                await asyncio.sleep(min(5.0, 0.1 * 2**tries))  # retry backoff
                tries += 1
                continue
            for call in page.calls:
                answer = self._answers.get(call.id) or await self.handle(call)
                self._answers[call.id] = answer
                while len(self._answers) > KEPT_ANSWERS:
                    self._answers.popitem(last=False)
                with contextlib.suppress(GPUlayerError):
                    await self.link.answer(self.job_id, answer)

    async def handle(self, call: WorkspaceCall) -> WorkspaceAnswer:
        try:
            if call.op == "sync" and call.delta is not None:
                return await self.sync(call.id, call.delta)
            if call.op == "collect" and call.collect is not None:
                return await self.collect(call.id, call.collect)
            raise GPUlayerError(f"workspace call {call.op} without its body")
        except GPUlayerError as exc:
            log.warning("workspace of %s: %s", self.job_id, exc.message)
            return WorkspaceAnswer(
                id=call.id, ok=False, version=self.version, error=exc.message, code=exc.code
            )

    async def sync(self, call_id: str, delta: WorkspaceDelta) -> WorkspaceAnswer:
        if delta.version == self.version and delta.base is not None:
            return WorkspaceAnswer(id=call_id, version=self.version)  # applied already
        if delta.base is not None and delta.base != self.version:
            return WorkspaceAnswer(id=call_id, version=self.version, need_full=True)
        assert self.dir is not None
        root = self.dir
        want = {e.digest: e for e in delta.put}
        need = [d for d, e in want.items() if self.synced.get(name_of(e)) != d or not self._here(e)]
        data: dict[str, bytes] = {}
        for group in packs.batches((d, want[d].size) for d in need):
            data.update(packs.unpack(await self.link.read_pack(self.job_id, group)))
        notes = Notes()
        await asyncio.to_thread(self._apply, root, delta, data, notes)
        self._ours()
        self.version = delta.version
        return WorkspaceAnswer(id=call_id, version=self.version, notes=notes.all())

    def _here(self, e: FileEntry) -> bool:
        k = self.index.files.get(name_of(e))
        return k is not None and k.digest == e.digest

    def _apply(
        self, root: Path, delta: WorkspaceDelta, data: dict[str, bytes], notes: Notes
    ) -> None:
        broot = os.fsencode(root)
        keep = {name_of(e) for e in delta.put}
        removes = [(name_of(e), e.digest) for e in delta.remove]
        if delta.base is None:  # the whole: what was synced and is no longer there goes
            removes += [(rel, d) for rel, d in self.synced.items() if rel not in keep]
            self.synced = {rel: d for rel, d in self.synced.items() if rel in keep}
        for e in delta.put:
            rel = name_of(e)
            current = self._current(broot, rel)
            if current is not None and current.digest == e.digest:
                self.synced[rel] = e.digest
                continue
            if current is not None and current.digest != self.synced.get(rel):
                moved = move_aside(root, rel, "worker")
                notes.add(
                    f"{shown(rel)} changed on the worker and on the Jupyter host: the worker's "
                    f"is kept as {shown(moved or rel)}"
                )
            body = data.get(e.digest)
            if body is None:
                raise GPUlayerError(f"workspace object for {shown(rel)} did not arrive")
            try:
                write_inside(root, rel, body, e.mode)
            except DiskFull:
                raise
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(broot, rel), follow_symlinks=False)
                # Its digest is the entry's (the pack verified it): no second hash.
                self.index.files[rel] = Known(
                    st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, e.mode, e.digest
                )
            self.synced[rel] = e.digest
        for rel, digest in removes:
            current = self._current(broot, rel)
            if current is not None and current.digest == digest:
                remove_inside(root, rel)
                self.index.files.pop(rel, None)
            self.synced.pop(rel, None)

    def _current(self, broot: bytes, rel: bytes) -> Known | None:
        from .tree import _read

        return _read(broot, checked(rel), self.index, Notes())

    def _ours(self) -> None:
        """The files a sync just wrote are no change of the code's: drop their events (a
        file the code writes meanwhile is still found: its digest differs from the synced)."""
        if self.detector is not None and self.detector.drain() is None:
            self._lost = True

    _lost = False

    async def collect(self, call_id: str, ask: CollectAsk) -> WorkspaceAnswer:
        assert self.dir is not None
        wanted = {p.encode() for p in ask.paths}
        forced = wanted | self._asked_inside()  # whatever their size
        changed_paths = self.detector.drain() if self.detector is not None else None
        if self._lost:
            changed_paths, self._lost = None, False
        files: dict[bytes, Known]
        if changed_paths is None or wanted:
            rules, no_cap = Rules(self.dir), Caps(files=10**7, bytes=1 << 62)
            files, notes = await asyncio.to_thread(survey, self.dir, no_cap, rules, self.index)
        else:
            seen, notes = look(self.dir, changed_paths | forced, Rules(self.dir), self.index)
            files = {rel: k for rel, k in seen.items() if k is not None}
        changed = [
            (rel, k)
            for rel, k in files.items()
            if (rel in forced) or (not wanted and self.synced.get(rel) != k.digest)
        ]
        for p in forced - set(files):
            notes.add(f"{shown(p)}: no such file on the worker")
        send: list[tuple[bytes, Known]] = []
        big: list[FileEntry] = []
        total = 0
        for rel, k in sorted(changed, key=lambda x: x[1].size):
            if rel not in forced and (k.size > ask.cap or total + k.size > ask.total):
                big.append(entry(rel, k))
                continue
            total += k.size
            send.append((rel, k))
        sent = await self._upload(send)
        outputs = [entry(rel, k) for rel, k in send if k.digest in sent]
        for rel, k in send:
            if k.digest in sent:
                self.synced[rel] = k.digest
            else:
                notes.add(f"{shown(rel)}: changed while being read; it comes with the next cell")
        return WorkspaceAnswer(
            id=call_id, version=self.version, outputs=outputs, big=big, notes=notes.all()
        )

    def _asked_inside(self) -> set[bytes]:
        """Files ``%gpulayer pull`` asked for from inside a GPU kernel (``pulls.WANTED``)."""
        from .pulls import WANTED

        assert self.dir is not None
        path = self.dir / WANTED
        try:
            names = path.read_bytes().splitlines()
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return set()
        return {n.strip() for n in names if n.strip()}

    async def _upload(self, send: list[tuple[bytes, Known]]) -> set[str]:
        """Put the files in the store (read again, each as it is at one moment); the digests
        that went (a file that changed since its scan does not, this time)."""
        assert self.dir is not None
        broot = os.fsencode(self.dir)
        by = {k.digest: rel for rel, k in send}
        sent: set[str] = set()
        for group in packs.batches((k.digest, k.size) for _, k in send):
            objs = await asyncio.to_thread(_read_objects, broot, [(d, by[d]) for d in group])
            if objs:
                await self.link.put_pack(self.job_id, await asyncio.to_thread(packs.pack, objs))
            sent.update(d for d, _ in objs)
        return sent


def _read_objects(broot: bytes, items: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    from .index import Changing, Unreadable, digest_of, read_stable

    out = []
    for digest, rel in items:
        try:
            data, _ = read_stable(os.path.join(broot, rel))
        except (FileNotFoundError, Changing, Unreadable):
            continue
        if digest_of(data) == digest:
            out.append((digest, data))
    return out
