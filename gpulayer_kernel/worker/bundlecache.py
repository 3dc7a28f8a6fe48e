"""The worker's bundle cache: small bundles in memory, unpacked ones on disk, both size-capped LRUs.

A Python job's bundle is fetched once per worker and checked (size limit, digest, a plain tar of
regular files: :func:`gpulayer_kernel.bundles.check_archive`). A small one (at most
:data:`MEMORY_BUNDLE` bytes: a notebook cell's) is kept in memory as its files, so a cell runs
from the text held here without touching the disk (:meth:`BundleCache.files`). When a job needs
the files on disk, the bundle is unpacked once per digest under ``<work_root>/bundles/<digest>``,
read-only; each such job gets its own copy as its working directory (a job may write beside its
code; the cached tree stays as it was shipped) and lets go of the cache once it has it, so a
bundle evicted while its job runs leaves that job its files. The disk cache holds at most
``ExecutorConfig.bundle_cache_bytes`` of unpacked files: after each new bundle, and when a job
lets go of one, the least recently used bundles that nobody holds are removed (a bundle being
copied is never evicted, so the cache may exceed its cap meanwhile); the memory one at most
:data:`MEMORY_BYTES`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tarfile
import tempfile
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from .. import bundles
from ..display import human_bytes
from ..errors import BundleError

log = logging.getLogger("gpulayer.worker")

DEFAULT_MAX_BYTES = 2 << 30
MEMORY_BUNDLE = 256 << 10  # bundles up to this size are also held in memory, as their files
MEMORY_BYTES = 32 << 20  # what the memory cache holds at most

Files = dict[str, bytes]


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (what an unpacked bundle costs on disk)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class BundleCache:
    """Unpacked bundles by digest, least recently used first; pinned while a job holds them."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()  # digest → bytes, LRU first
        self._pins: dict[str, int] = {}
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._scanned = False
        self._files: OrderedDict[str, Files] = OrderedDict()  # digest → files, LRU first
        self._files_bytes = 0
        self._large: set[str] = set()  # fetched once and found too big to hold in memory

    @property
    def size(self) -> int:
        """Bytes of unpacked bundles the cache holds now."""
        return sum(self._sizes.values())

    def _scan(self) -> None:
        """Adopt what a previous run of this worker left (oldest first); drop half-done unpacks."""
        self._scanned = True
        if not self.root.is_dir():
            return
        found: list[tuple[float, str, int]] = []
        for entry in self.root.iterdir():
            name = entry.name
            if entry.is_dir() and len(name) == 64 and all(c in "0123456789abcdef" for c in name):
                found.append((entry.stat().st_mtime, name, tree_bytes(entry)))
            elif entry.is_dir():
                remove_tree(entry)
            else:
                entry.unlink(missing_ok=True)
        for _mtime, name, size in sorted(found):
            self._sizes[name] = size

    async def files(self, digest: str, fetch: Callable[[], Awaitable[bytes]]) -> Files | None:
        """The files of a small bundle, held in memory (fetched and checked once per digest);
        None for one too large to hold, which is then unpacked on disk for :meth:`acquire`.
        Raises :class:`BundleError` for a bundle that is not one."""
        held = self._files.get(digest)
        if held is not None:
            self._files.move_to_end(digest)
            return held
        if digest in self._large or digest in self._sizes:
            return None
        data = await fetch()
        _check_size(digest, data)
        if len(data) > MEMORY_BUNDLE:
            self._large.add(digest)
            # Fetched already: unpack it now, so that acquire() does not fetch it again.
            await self.acquire(digest, _given(data))
            self.release(digest)
            return None
        files = _read(data, digest)
        self._files[digest] = files
        self._files_bytes += len(data)
        while self._files_bytes > MEMORY_BYTES and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._files_bytes -= sum(len(v) for v in dropped.values())
        return files

    async def acquire(self, digest: str, fetch: Callable[[], Awaitable[bytes]]) -> Path:
        """The unpacked bundle ``digest`` (fetched and unpacked if missing), pinned until
        :meth:`release`. Raises :class:`BundleError` for a bundle that is not one."""
        if not self._scanned:
            await asyncio.to_thread(self._scan)
        self._pins[digest] = self._pins.get(digest, 0) + 1
        try:
            while digest not in self._sizes:
                loading = self._loading.get(digest)
                if loading is not None:  # another job is fetching it: wait, then look again
                    await asyncio.shield(loading)
                    continue
                await self._load(digest, fetch)
        except BaseException:
            self.release(digest)
            raise
        self._sizes.move_to_end(digest)
        return self.root / digest

    async def _load(self, digest: str, fetch: Callable[[], Awaitable[bytes]]) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[digest] = done
        try:
            target = self.root / digest
            held = self._files.get(digest)
            if held is not None:  # checked when it was read: written out as it is
                size = await asyncio.to_thread(_materialize, held, target)
            else:
                data = await fetch()
                _check_size(digest, data)
                size = await asyncio.to_thread(_unpack, data, digest, target)
                del data
            self._sizes[digest] = size
            self._evict()
        finally:
            del self._loading[digest]
            done.set_result(None)

    def release(self, digest: str) -> None:
        """A job is done with ``digest``; evict what the cap no longer allows."""
        left = self._pins.get(digest, 0) - 1
        if left > 0:
            self._pins[digest] = left
        else:
            self._pins.pop(digest, None)
        self._evict()

    def _evict(self) -> None:
        total = self.size
        for digest in list(self._sizes):
            if total <= self.max_bytes:
                return
            if self._pins.get(digest):
                continue  # a running job holds it
            total -= self._sizes.pop(digest)
            remove_tree(self.root / digest)
            log.debug("bundle cache: evicted %s (now %d bytes)", digest[:12], total)


def _given(data: bytes) -> Callable[[], Awaitable[bytes]]:
    async def fetch() -> bytes:
        return data

    return fetch


def _check_size(digest: str, data: bytes) -> None:
    if len(data) > bundles.MAX_BUNDLE_BYTES:  # before hashing or parsing any of it
        raise BundleError(
            f"bundle {digest[:12]}… is {human_bytes(len(data))}; the limit is "
            f"{human_bytes(bundles.MAX_BUNDLE_BYTES)}",
            hint="ship large data as artifacts or on the worker's disk, not in the bundle",
            details={"digest": digest, "bytes": len(data)},
        )


def _read(data: bytes, digest: str) -> Files:
    """Verify a small bundle and read its files into memory (the checks ``unpack`` makes)."""
    try:
        bundles.verify(data, digest)
        bundles.check_archive(data, digest)
        return bundles.read_files(data)
    except BundleError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise _unpack_error(digest, exc) from None


def _unpack(data: bytes, digest: str, target: Path) -> int:
    """Verify and unpack ``data`` (read-only); its size on disk. Any archive error becomes a
    BundleError."""
    try:
        bundles.unpack(data, digest, target)
    except BundleError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise _unpack_error(digest, exc) from None
    _read_only(target)
    return tree_bytes(target)


def _materialize(files: Files, target: Path) -> int:
    """Write a bundle held in memory to disk (read-only, atomically, as ``unpack`` does)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        for name, data in files.items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _read_only(target)
    return tree_bytes(target)


def _unpack_error(digest: str, exc: Exception) -> BundleError:
    return BundleError(
        f"bundle {digest[:12]}… cannot be unpacked: {exc}",
        hint="bundles are plain tar archives of regular files; build them with "
        "gpulayer_kernel.bundles.build",
        details={"digest": digest},
    )


def _read_only(root: Path) -> None:
    """The cached tree stays as shipped: jobs work in copies of it."""
    for path, _dirs, names in os.walk(root):
        for name in names:
            os.chmod(os.path.join(path, name), 0o444)
        os.chmod(path, 0o555)


def remove_tree(root: Path) -> None:
    """Remove a (read-only) cached tree: its folders are made writable first."""
    for path, _dirs, _names in os.walk(root):
        with contextlib.suppress(OSError):
            os.chmod(path, 0o755)
    shutil.rmtree(root, ignore_errors=True)


def copy_tree(src: Path, dst: Path) -> None:
    """A job's own copy of an unpacked bundle (its working directory), writable by the job."""
    for path, _dirs, names in os.walk(src):
        rel = os.path.relpath(path, src)
        target = dst if rel == "." else dst / rel
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copyfile(os.path.join(path, name), target / name)
