"""The sending and the writing back of one-shot cells' workspaces (ADR 0022; ``cells.py`` is
the fast path that loads this only when a manifest must ride with a job).

:class:`CellFolder` keeps one notebook folder's manifest current for one control plane: the
change detector says what changed since the last cell (nothing: the same manifest, no request),
only files the store lacks for this user are uploaded (small ones without asking first: the
upload is the proof of possession), then the manifest itself. :func:`bring_back` writes a
finished job's outputs into the folder against the manifest it was given.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..codes import ErrorCode
from ..contracts import Artifact, Job
from ..contracts.workspace import (
    RECORD_PREFIX,
    CollectAsk,
    WorkspaceAnswer,
    WorkspaceManifest,
    WorkspaceSource,
)
from ..errors import GPUlayerError
from . import pack as packs
from .host import MISSING_BATCH, WorkspaceLink, _read_group, big_words, write_back
from .index import Index, Known, digest_of
from .names import name_of, shown
from .scan import IGNORE_FILE, Caps, Notes, Rules
from .tree import entry, look, survey
from .watch import Detector

PUT_UNASKED = 256 << 10  # new files this small are uploaded without asking what is missing
T = TypeVar("T")


class CellFolder:
    """A notebook folder's manifest, kept current for its one-shot cells (one per control
    plane: what its store holds for this user is remembered, never asked twice)."""

    def __init__(self, root: Path, link: WorkspaceLink) -> None:
        self.root = root
        self.link = link
        self.caps = Caps.from_env()
        self.rules = Rules(root)
        self.index = Index()
        self.detector = Detector(root, self.rules)
        self.watching = False
        self.files: dict[bytes, Known] = {}
        self.digest: str | None = None  # the manifest's, in the store
        self.base: Mapping[bytes, str] = {}  # its files' digests (replaced, never changed)
        self.stored: set[str] = set()  # digests the store holds for this user
        self.big: dict[str, str] = {}  # outputs left on a worker: path -> that worker
        self.lock = asyncio.Lock()

    async def manifest(self) -> tuple[str, Mapping[bytes, str], list[str]]:
        """The folder's manifest digest (uploaded, with every file it names), its files'
        digests, and notes (WorkspaceTooBig propagates)."""
        link = self.link
        async with self.lock:
            changed: set[bytes] | None = None
            if not self.watching:
                self.watching = True
                self.detector.start()  # before the first scan: nothing written after is missed
            else:
                changed = self.detector.drain()
            if changed is not None and not changed and self.digest is not None:
                return self.digest, self.base, []  # no change: nothing to send
            if changed is None or IGNORE_FILE.encode() in changed or self.digest is None:
                self.rules = self.detector.rules = Rules(self.root)
                files, notes = await asyncio.to_thread(
                    survey, self.root, self.caps, self.rules, self.index
                )
            else:
                seen, notes = look(self.root, changed, self.rules, self.index)
                files = dict(self.files)
                for rel, k in seen.items():
                    if k is None:
                        files.pop(rel, None)
                    else:
                        files[rel] = k
            files = await self._upload(link, files, notes)
            entries = sorted((entry(rel, k) for rel, k in files.items()), key=name_of)
            body = WorkspaceManifest.model_construct(files=entries).model_dump_json().encode()
            digest = digest_of(body)
            if digest not in self.stored:
                await _again(partial(link.put_pack, packs.pack([(digest, body)])), self.root)
                self.stored.add(digest)
            self.files, self.digest = files, digest
            self.base = {rel: k.digest for rel, k in files.items()}
            return digest, self.base, notes.all()

    async def _upload(
        self, link: WorkspaceLink, files: dict[bytes, Known], notes: Notes
    ) -> dict[bytes, Known]:
        """Put the files the store lacks for this user; ``files`` less any that changed while
        read (as they were last sent, if they were: the next cell sends them)."""
        new = {k.digest: (rel, k) for rel, k in files.items() if k.digest not in self.stored}
        if not new:
            return files
        missing = list(new)
        if sum(k.size for _, k in new.values()) > PUT_UNASKED:  # ask first: big, or many
            asked = missing
            missing = []
            for i in range(0, len(asked), MISSING_BATCH):
                batch = asked[i : i + MISSING_BATCH]
                missing += await _again(partial(link.missing, batch), self.root)
            self.stored.update(set(asked) - set(missing))
        failed: set[str] = set()
        for group in packs.batches((d, new[d][1].size) for d in missing):
            wanted = [entry(*new[d]) for d in group]
            objs = await asyncio.to_thread(_read_group, self.root, wanted)
            failed.update(set(group) - {d for d, _ in objs})
            if objs:
                blob = await asyncio.to_thread(packs.pack, objs)
                await _again(partial(link.put_pack, blob), self.root)
                self.stored.update(d for d, _ in objs)
        if not failed:
            return files
        kept = dict(files)
        for d in failed:
            rel, _ = new[d]
            notes.add(f"{shown(rel)}: changed while being sent; it goes with the next cell")
            self.index.files.pop(rel, None)
            self.detector.dirty(rel)
            old = self.files.get(rel)
            if old is not None:
                kept[rel] = old
            else:
                kept.pop(rel, None)
        return kept

    def close(self) -> None:
        self.detector.close()


# A folder's manifest per control plane session (what its store holds differs).
_FOLDERS: weakref.WeakKeyDictionary[Any, dict[str, CellFolder]] = weakref.WeakKeyDictionary()


def folder_of(s: Any, source: WorkspaceSource) -> CellFolder:
    """The folder's manifest keeper for the control plane session ``s``."""
    from ..client.workspace import link_for

    mine = _FOLDERS.setdefault(s, {})
    folder = mine.get(source.folder)
    if folder is None:
        folder = mine[source.folder] = CellFolder(Path(source.folder), link_for(s))
    return folder


async def bring_back(
    s: Any,
    job: Job,
    records: list[Artifact],
    folder: CellFolder,
    base: Mapping[bytes, str],
    cap: int | None,
) -> tuple[list[str], bool]:
    """Write each node's outputs (``records``) into the folder, against the manifest the job
    was given (``base``); the words for the notebook, and whether a worker copies the folder
    though the cell sent none (the fleet changed)."""
    words: list[str] = []
    unsent = False
    for record in records:
        try:
            answer = WorkspaceAnswer.model_validate_json(await s.get_blob(record.digest))
        except (GPUlayerError, ValueError) as exc:
            words.append(f"the outputs' record {record.name} could not be read: {exc}")
            continue
        if not answer.ok:
            unsent = unsent or answer.code == ErrorCode.WORKSPACE_NO_MANIFEST
            words.append(answer.error or "the outputs did not come back")
            continue
        data: dict[str, bytes] = {}
        for group in packs.batches((e.digest, e.size) for e in answer.outputs):
            blob = await _again(partial(folder.link.read_pack, group), folder.root)
            data.update(packs.unpack(blob))
        folder.stored.update(data)  # the next manifest names them: nothing to upload
        # Each node against the job's manifest: two nodes writing one file keep both.
        words += await asyncio.to_thread(
            write_back, folder.root, list(answer.outputs), data, dict(base)
        )
        for e in answer.outputs:
            folder.big.pop(e.path, None)
        if answer.big:
            worker = _worker_of(job, record.name)
            folder.big.update((e.path, worker) for e in answer.big)
            words.append(big_words(answer.big, cap or CollectAsk().cap, f"worker {worker}"))
        words += answer.notes
    return words, unsent


def _worker_of(job: Job, record: str) -> str:
    node = record.removeprefix(RECORD_PREFIX).partition(".")[0]
    nodes = job.placement.nodes if job.placement is not None else []
    found = [n.worker_name for n in nodes if str(n.node_rank) == node]
    return found[0] if found else "the worker"


async def _again(make: Callable[[], Awaitable[T]], root: Path) -> T:
    from .host import _again as again

    return await again(make, root)
