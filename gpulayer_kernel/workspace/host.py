"""The Jupyter host's end of a synced workspace: send the notebook's folder, take outputs back.

:class:`HostWorkspace` is one session's (a GPU kernel's, or a session's of ``%%gpulayer``
cells). ``start`` sends the whole folder: a full scan, what the control plane's store lacks of
this user's files in packs, then the manifest. ``before_cell`` (the relay calls it on each
``execute_request``) drains the change detector: nothing changed is the common case and costs
microseconds; otherwise only the changed files go, as a delta on the version the worker holds
(a worker that holds another version asks for the whole, and gets it). ``after_cell`` asks the
worker for the files the cell wrote or changed and writes them into the folder — never over a
file the user changed meanwhile: that one stays, the worker's goes beside it
(``results.worker-1.csv``) and a note says so. Files over the cap stay on the worker, listed in
one line with the ``%gpulayer pull`` that fetches them.

Calls are serialized (one lock): a cell's outputs are in the folder before the next cell's
changes are looked for.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from ..contracts.workspace import (
    CollectAsk,
    FileEntry,
    WorkspaceAnswer,
    WorkspaceCall,
    WorkspaceDelta,
    WorkspaceView,
)
from ..display import human_bytes
from ..errors import GPUlayerError
from . import pack as packs
from .index import Index, Known, digest_of
from .names import move_aside, name_of, read_inside, shown, write_inside
from .plan import BACK_ENV
from .scan import IGNORE_FILE, Caps, Notes, Rules
from .tree import entry, look, survey
from .watch import Detector

log = logging.getLogger("gpulayer.workspace")

CALL_WAIT = 25.0  # seconds one call waits on the control plane before it is sent again
MISSING_BATCH = 20_000


class WorkspaceLink(Protocol):
    """The Jupyter host's workspace calls on the control plane (in-process or HTTP)."""

    async def view(self, session_id: str) -> WorkspaceView | None: ...
    async def missing(self, digests: list[str]) -> list[str]: ...
    async def put_pack(self, blob: bytes) -> None: ...
    async def read_pack(self, digests: list[str]) -> bytes: ...
    async def call(self, session_id: str, call: WorkspaceCall, wait: float) -> WorkspaceAnswer: ...


Progress = Callable[[int, int], None]  # (bytes done, bytes in all)
T = TypeVar("T")


class HostWorkspace:
    """One session's synced workspace, seen from the Jupyter host."""

    def __init__(
        self,
        root: Path,
        session_id: str,
        link: WorkspaceLink,
        *,
        caps: Caps | None = None,
        collect: CollectAsk | None = None,
    ) -> None:
        self.root = root
        self.session_id = session_id
        self.link = link
        self.caps = caps or Caps.from_env()
        self.ask = collect or CollectAsk(cap=_env_bytes(BACK_ENV, CollectAsk().cap))
        self.rules = Rules(root)
        self.index = Index()
        self.detector = Detector(root, self.rules)
        self.synced: dict[bytes, str] = {}  # what both sides agreed, per path
        self.version = 0
        self.off: str | None = None  # why there is no workspace (too big, …)
        self.lock = asyncio.Lock()
        self._watching = False

    # -- the whole folder, once ------------------------------------------------------------------

    async def start(self) -> list[str]:
        """Send the folder (WorkspaceTooBig propagates: the caller starts without one)."""
        async with self.lock:
            if not self._watching:
                self._watching = True
                self.detector.start()
            files, notes = await asyncio.to_thread(
                survey, self.root, self.caps, self.rules, self.index
            )
            puts = [entry(rel, k) for rel, k in files.items()]
            await self._send(puts, [], full=True, notes=notes)
            return notes.all()

    # -- each cell --------------------------------------------------------------------------------

    async def before_cell(self) -> None:
        """Send what changed since the last cell (nothing: a few microseconds)."""
        if self.off is not None:
            return
        if not self._watching:
            self._watching = True
            self.detector.start()  # before the first scan: nothing written after it is missed
        changed = self.detector.drain()
        if changed is not None and not changed and self.version:
            return
        if not self.version:
            changed = None  # the first time: the whole folder
        if changed is None or IGNORE_FILE.encode() in changed:
            self.rules = self.detector.rules = Rules(self.root)  # its rules may have changed
            changed = None
        async with self.lock:
            current: dict[bytes, Known | None]
            if changed is None:
                files, notes = await asyncio.to_thread(
                    survey, self.root, self.caps, self.rules, self.index
                )
                current = {p: files.get(p) for p in set(files) | set(self.synced)}
            else:
                current, notes = look(self.root, changed, self.rules, self.index)
            puts: list[FileEntry] = []
            removes: list[FileEntry] = []
            for rel, k in current.items():
                old = self.synced.get(rel)
                if k is None:
                    if old is not None:
                        removes.append(_gone(rel, old))
                elif k.digest != old:
                    puts.append(entry(rel, k))
            if puts or removes or not self.version:
                await self._send(puts, removes, full=not self.version, notes=notes)

    async def _send(
        self, puts: list[FileEntry], removes: list[FileEntry], *, full: bool, notes: Notes
    ) -> None:
        if full and not self.synced and sum(e.size for e in puts) > packs.PACK_BYTES:
            await self._send_first(puts, notes)
            return
        failed = await self._upload(puts)
        if failed:  # changed since they were hashed: they go with the next cell
            for e in [e for e in puts if e.digest in failed]:
                notes.add(f"{e.path}: changed while being sent; it goes with the next cell")
                self.index.files.pop(name_of(e), None)
                self.detector.dirty(name_of(e))
            puts = [e for e in puts if e.digest not in failed]
        delta = WorkspaceDelta(
            base=None if full else self.version, version=self.version + 1, put=puts, remove=removes
        )
        answer = await self._call(WorkspaceCall(id=_id(), op="sync", delta=delta))
        if answer.need_full and not full:
            entries = [entry(rel, k) for rel, k in self.index.files.items()]
            gone = await self._upload(entries)
            entries = [e for e in entries if e.digest not in gone]
            full_delta = WorkspaceDelta(base=None, version=self.version + 1, put=entries)
            answer = await self._call(WorkspaceCall(id=_id(), op="sync", delta=full_delta))
            puts, removes = entries, []
            self.synced = {}
        _raise_for(answer)
        for e in removes:
            self.synced.pop(name_of(e), None)
        for e in puts:
            self.synced[name_of(e)] = e.digest
        self.version = answer.version
        for n in notes.all() + answer.notes:
            log.warning("workspace %s: %s", self.root, n)

    async def _send_first(self, puts: list[FileEntry], notes: Notes) -> None:
        """A big folder's first sync in pieces of a pack each: the worker fetches and writes
        piece k while piece k+1 is read and uploaded here. Each piece is a delta on the last
        (the first replaces whatever the worker held), answered in order."""
        groups: list[list[FileEntry]] = [[]]
        size = 0
        for e in puts:
            if groups[-1] and size + e.size > packs.PACK_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(e)
            size += e.size
        box: list[asyncio.Task[WorkspaceAnswer] | None] = [None]  # the call in flight
        try:
            answer = await self._pieces(groups, notes, box)
        finally:
            for task in box:
                if task is not None and not task.done():  # a failed piece: its call goes too
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        for n in notes.all() + answer.notes:
            log.warning("workspace %s: %s", self.root, n)

    async def _pieces(
        self,
        groups: list[list[FileEntry]],
        notes: Notes,
        box: list[asyncio.Task[WorkspaceAnswer] | None],
    ) -> WorkspaceAnswer:
        pending: asyncio.Task[WorkspaceAnswer] | None = None
        last: list[FileEntry] = []
        for i, group in enumerate(groups):
            failed = await self._upload(group)
            for e in [e for e in group if e.digest in failed]:
                notes.add(f"{e.path}: changed while being sent; it goes with the next cell")
                self.index.files.pop(name_of(e), None)
                self.detector.dirty(name_of(e))
            group = [e for e in group if e.digest not in failed]
            if pending is not None:
                self._applied(await pending, last)
            delta = WorkspaceDelta(
                base=None if i == 0 else self.version, version=self.version + 1, put=group
            )
            call = WorkspaceCall(id=_id(), op="sync", delta=delta)
            pending = box[0] = asyncio.ensure_future(self._call(call))
            last = group
        assert pending is not None
        answer = await pending
        self._applied(answer, last)
        return answer

    def _applied(self, answer: WorkspaceAnswer, puts: list[FileEntry]) -> None:
        _raise_for(answer)
        for e in puts:
            self.synced[name_of(e)] = e.digest
        self.version = answer.version

    async def _upload(self, puts: list[FileEntry]) -> set[str]:
        """Put the files the store lacks for this user, in packs, each read again as it is at
        one moment; the digests whose file no longer has them (changed since it was hashed)."""
        want = {e.digest: e for e in puts}
        missing: list[str] = []
        keys = list(want)
        for i in range(0, len(keys), MISSING_BATCH):
            batch = keys[i : i + MISSING_BATCH]
            missing += await _again(partial(self.link.missing, batch), self.root)
        failed: set[str] = set()
        for group in packs.batches((d, want[d].size) for d in missing):
            objs = await asyncio.to_thread(_read_group, self.root, [want[d] for d in group])
            failed.update(set(group) - {d for d, _ in objs})
            if objs:
                blob = await asyncio.to_thread(packs.pack, objs)
                await _again(partial(self.link.put_pack, blob), self.root)
        return failed

    # -- outputs ---------------------------------------------------------------------------------

    async def after_cell(self, paths: list[str] | None = None) -> str | None:
        """Bring back what the cell wrote or changed; a line for the notebook, or None."""
        if self.off is not None or not self.version:
            return None
        async with self.lock:
            ask = self.ask if not paths else self.ask.model_copy(update={"paths": paths})
            answer = await self._call(WorkspaceCall(id=_id(), op="collect", collect=ask))
            _raise_for(answer)
            words = await self._write_back(answer.outputs)
            if answer.big:
                words.append(big_words(answer.big, ask.cap))
            words += answer.notes
            return "\n".join(f"gpulayer: {w}" for w in words) or None

    async def _write_back(self, outputs: list[FileEntry]) -> list[str]:
        if not outputs:
            return []
        data: dict[str, bytes] = {}
        for group in packs.batches((e.digest, e.size) for e in outputs):
            blob = await _again(partial(self.link.read_pack, group), self.root)
            data.update(packs.unpack(blob))
        return await asyncio.to_thread(self._apply_outputs, outputs, data)

    def _apply_outputs(self, outputs: list[FileEntry], data: dict[str, bytes]) -> list[str]:
        wrote: set[bytes] = set()
        words = write_back(self.root, outputs, data, self.synced, wrote)
        # Our own writes are not the user's edits: their events go (hashing an output again at
        # the next cell is what this saves). Anything else that changed meanwhile, a file saved
        # in Lab while this cell's outputs came back, is still news for the next cell.
        changed = self.detector.drain()
        if changed is None:
            self.detector.lose()
        else:
            for rel in changed - wrote:
                self.detector.dirty(rel)
        return words

    async def pull(self, paths: list[str], progress: Progress | None = None) -> str | None:
        """Fetch named files however big (``%gpulayer pull``, ``gpulayer pull``)."""
        big = self.ask.model_copy(update={"cap": 1 << 62, "total": 1 << 62})
        async with self.lock:
            answer = await self._call(
                WorkspaceCall(
                    id=_id(), op="collect", collect=big.model_copy(update={"paths": paths})
                )
            )
            _raise_for(answer)
            total = sum(e.size for e in answer.outputs)
            done = 0
            data: dict[str, bytes] = {}
            for group in packs.batches((e.digest, e.size) for e in answer.outputs):
                blob = await _again(partial(self.link.read_pack, group), self.root)
                data.update(packs.unpack(blob))
                done += sum(len(data[d]) for d in group if d in data)
                if progress is not None:
                    progress(done, total)
            words = await asyncio.to_thread(self._apply_outputs, answer.outputs, data)
            return "\n".join(words + answer.notes) or None

    async def _call(self, call: WorkspaceCall) -> WorkspaceAnswer:
        """The call, sent again (same id) until the worker answers: a restarted control plane
        or a slow worker costs a retry, never a second application."""
        return await _again(lambda: self.link.call(self.session_id, call, CALL_WAIT), self.root)

    def close(self) -> None:
        self.detector.close()


RETRY_FOR = 120.0  # seconds a call is retried while the control plane is away (a restart)


def _env_bytes(name: str, default: int) -> int:
    import os

    raw = os.environ.get(name, "")
    return int(raw) if raw.isdigit() else default


async def _again(make: Callable[[], Awaitable[T]], root: Path) -> T:
    """``make()``, again while the control plane is unreachable or the worker slow to answer."""
    loop = asyncio.get_running_loop()
    until = loop.time() + RETRY_FOR
    tries = 0
    while True:
        try:
            return await make()
        except GPUlayerError as exc:
            if exc.status != 503 or loop.time() > until:
                raise
            log.info("workspace %s: %s; asking again", root, exc.message)
            await asyncio.sleep(min(2.0, 0.05 * 2**tries))  # retry backoff
            tries += 1


def _id() -> str:
    return secrets.token_hex(8)


def _gone(rel: bytes, digest: str) -> FileEntry:
    from .names import wire

    path, raw = wire(rel)
    return FileEntry.model_construct(path=path, raw=raw, size=0, mode=0o644, digest=digest)


def _read_group(root: Path, entries: list[FileEntry]) -> list[tuple[str, bytes]]:
    """Each entry's bytes, verified against its digest (a file changed since: read as it is
    now, and sent under its new digest's name only if that is what the entry says)."""
    import os

    from .index import Changing, Unreadable, read_stable

    out = []
    for e in entries:
        try:
            data, _ = read_stable(os.path.join(os.fsencode(root), name_of(e)))
        except (FileNotFoundError, Changing, Unreadable):
            continue
        if digest_of(data) == e.digest:
            out.append((e.digest, data))
    return out


def big_words(big: list[FileEntry], cap: int, where: str = "the worker") -> str:
    """One line naming the outputs that stayed on the worker, and how to fetch them."""
    listed = ", ".join(f"{e.path} ({human_bytes(e.size)})" for e in big[:5])
    more = f" and {len(big) - 5} more" if len(big) > 5 else ""
    return (
        f"left on {where} (over {human_bytes(cap)}): {listed}{more}; fetch with "
        f"%gpulayer pull {big[0].path}"
    )


def write_back(
    root: Path,
    outputs: list[FileEntry],
    data: dict[str, bytes],
    synced: dict[bytes, str],
    wrote: set[bytes] | None = None,
) -> list[str]:
    """Write the worker's ``outputs`` into ``root``, never over a file changed here since
    ``synced`` (what both sides last agreed on; updated): that one stays, the worker's goes
    beside it. The words about it, for the notebook; ``wrote`` gets the paths written."""
    words: list[str] = []
    written = wrote if wrote is not None else set()
    for e in outputs:
        try:
            rel = name_of(e)
        except GPUlayerError as exc:
            words.append(f"refused a file name from the worker: {exc.message}")
            continue
        local = read_inside(root, rel)
        local_digest = None if local is None else digest_of(local)
        body = data.get(e.digest)
        if body is None:
            continue
        try:
            if local_digest == e.digest:
                pass
            elif local is None or local_digest == synced.get(rel):
                write_inside(root, rel, body, e.mode)
                written.add(rel)
            else:
                kept = _conflict_copy(root, rel, body, e.mode)
                written.add(kept)
                words.append(
                    f"{shown(rel)} changed here and on the worker since the last sync: "
                    f"yours is kept, the worker's is {shown(kept)}"
                )
        except GPUlayerError as exc:
            words.append(exc.message)
            continue
        synced[rel] = e.digest
    return words


def _conflict_copy(root: Path, rel: bytes, body: bytes, mode: int) -> bytes:
    stem, dot, ext = rel.rpartition(b".")
    if not stem or b"/" in ext:
        stem, dot, ext = rel, b"", b""
    for n in range(1, 1000):
        name = stem + f".worker-{n}".encode() + dot + ext
        if read_inside(root, name) is None:
            write_inside(root, name, body, mode)
            return name
    return move_aside(root, rel, "worker") or rel


def _raise_for(answer: WorkspaceAnswer) -> None:
    if not answer.ok:
        raise GPUlayerError(
            answer.error or "the worker could not apply the workspace",
            hint="the notes above say which files; the folder here is unchanged",
            code=answer.code or "workspace_failed",
        )
