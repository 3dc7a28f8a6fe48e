"""The worker's bundle cache: verified, unpacked bundles on disk, a size-capped LRU.

A Python job's bundle is fetched once per worker, checked (size limit, digest, a plain tar of
regular files: :func:`gpulayer_kernel.bundles.unpack`) and unpacked under
``<work_root>/bundles/<digest>``; each job then gets its own copy as its working directory (a job
may write beside its code; the cached tree stays as it was shipped). The cache holds at most
``ExecutorConfig.bundle_cache_bytes`` of unpacked files: after each new bundle, and when a job
lets go of one, the least recently used bundles that no running job holds are removed. A bundle
in use is never evicted, so the cache may exceed its cap while running jobs hold more than it.

Nothing is kept in memory but names and sizes (the cache used to hold every bundle's bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tarfile
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from .. import bundles
from ..errors import BundleError

log = logging.getLogger("gpulayer.worker")

DEFAULT_MAX_BYTES = 2 << 30


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
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        for _mtime, name, size in sorted(found):
            self._sizes[name] = size

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
            data = await fetch()
            if len(data) > bundles.MAX_BUNDLE_BYTES:  # before hashing or parsing any of it
                raise BundleError(
                    f"bundle {digest[:12]}… is {len(data)} bytes; the limit is "
                    f"{bundles.MAX_BUNDLE_BYTES}",
                    hint="ship large data as artifacts or on the worker's disk, not in the bundle",
                    details={"digest": digest, "bytes": len(data)},
                )
            target = self.root / digest
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
            shutil.rmtree(self.root / digest, ignore_errors=True)
            log.debug("bundle cache: evicted %s (now %d bytes)", digest[:12], total)


def _unpack(data: bytes, digest: str, target: Path) -> int:
    """Verify and unpack ``data``; its size on disk. Any archive error becomes a BundleError."""
    try:
        bundles.unpack(data, digest, target)
    except BundleError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise BundleError(
            f"bundle {digest[:12]}… cannot be unpacked: {exc}",
            hint="bundles are plain tar archives of regular files; build them with "
            "gpulayer_kernel.bundles.build",
            details={"digest": digest},
        ) from None
    return tree_bytes(target)


def copy_tree(src: Path, dst: Path) -> None:
    """A job's own copy of an unpacked bundle (its working directory)."""
    shutil.copytree(src, dst, symlinks=False)
