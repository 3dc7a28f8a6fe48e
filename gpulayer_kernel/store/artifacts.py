"""Content-addressed file storage (ADR 0008): files named by sha256, verified on every read.

``put(data)`` stores bytes in hand; ``writer()`` takes a blob in pieces (an upload streaming in),
hashing as it goes, and names it by digest only at ``commit`` (a mismatch is refused then).
"""

from __future__ import annotations

import abc
import hashlib
import io
import os
import tempfile
import threading
import time
from pathlib import Path

from ..contracts._base import SHA256_RE
from ..errors import BundleError, InvalidInput, NotFound


class ArtifactStore(abc.ABC):
    """Blobs named by their sha256. Bundles and job artifacts both live here."""

    @abc.abstractmethod
    def put(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data``; if ``digest`` is given it must match. Returns the digest."""

    @abc.abstractmethod
    def has(self, digest: str) -> bool: ...

    @abc.abstractmethod
    def get(self, digest: str) -> bytes:
        """Return the blob, verified against its name; NotFound if absent."""

    @abc.abstractmethod
    def size(self, digest: str) -> int: ...

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        """Store many ``(digest, data)`` blobs whose digests the caller verified (a workspace
        pack, ADR 0022); a store may make them durable together rather than one by one."""
        for digest, data in items:
            self.put(data, digest)

    def writer(self) -> BlobWriter:
        """A blob arriving in pieces. This default gathers them in memory and calls ``put``."""
        return _BufferedWriter(self)


class BlobDiscarded(Exception):
    """``commit`` on a writer that was discarded (its upload was abandoned meanwhile)."""


class BlobWriter(abc.ABC):
    """One blob arriving in pieces: ``write`` them, then ``commit`` or ``discard``.

    Calls may come from worker threads (one at a time); ``discard`` may come from another
    thread while a ``write`` runs, and waits for it. After ``commit`` or ``discard`` nothing
    else happens.
    """

    size: int = 0

    @abc.abstractmethod
    def write(self, data: bytes | bytearray) -> None: ...

    @abc.abstractmethod
    def commit(self, digest: str | None = None) -> str:
        """Store what was written, if its sha256 is ``digest`` (BundleError if not).

        BlobDiscarded if ``discard`` came first.
        """

    @abc.abstractmethod
    def discard(self) -> None:
        """Drop what was written (idempotent; a no-op after ``commit``)."""


class _BufferedWriter(BlobWriter):
    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self._buf: io.BytesIO | None = io.BytesIO()

    def write(self, data: bytes | bytearray) -> None:
        if self._buf is not None:
            self._buf.write(data)
            self.size += len(data)

    def commit(self, digest: str | None = None) -> str:
        if self._buf is None:
            raise BlobDiscarded()
        data, self._buf = self._buf.getvalue(), None
        return self.store.put(data, digest)

    def discard(self) -> None:
        self._buf = None


def check_digest(digest: str) -> str:
    if not SHA256_RE.match(digest):
        raise InvalidInput(
            f"{digest!r} is not a sha256 digest",
            hint="digests are 64 lowercase hex characters",
            details={"digest": digest},
        )
    return digest


def hash_checked(data: bytes, claimed: str | None) -> str:
    """The sha256 of ``data``; refuses content that does not match the digest it was sent as."""
    return _as_claimed(hashlib.sha256(data).hexdigest(), claimed)


def _as_claimed(actual: str, claimed: str | None) -> str:
    """``actual``, if it is the digest the content was sent as (BundleError if not)."""
    if claimed is not None and actual != check_digest(claimed):
        raise BundleError(
            f"content has sha256 {actual[:12]}…, not the {claimed[:12]}… it was sent as",
            hint="the upload was corrupted or altered; send it again",
            details={"expected": claimed, "actual": actual},
        )
    return actual


UPLOAD_PREFIX = ".upload-"
# An upload's temp file left by a crash is removed when a store opens the folder this much later
# (never sooner: another process may be writing one right now).
STALE_UPLOAD_SECONDS = 24 * 3600.0


class LocalArtifactStore(ArtifactStore):
    """Files under ``root/ab/abcdef…``, written temp → fsync → rename: a crash leaves no half."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        cutoff = time.time() - STALE_UPLOAD_SECONDS
        for stale in self.root.glob(UPLOAD_PREFIX + "*"):
            try:
                if stale.stat().st_mtime < cutoff:
                    stale.unlink()
            except OSError:
                pass  # gone already, or not ours to remove

    def writer(self) -> BlobWriter:
        """Stream into a temp file beside the blobs (same file system: the rename is atomic)."""
        return _FileWriter(self)

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[:2] / digest

    def put(self, data: bytes, digest: str | None = None) -> str:
        actual = hash_checked(data, digest)
        path = self._path(actual)
        if path.exists():
            return actual
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return actual

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        # One sync for the lot: an fsync per file costs ~4 ms here, 8 s for 2,000 small files.
        # The digests were verified as the pack was read (workspace/pack.py): not hashed again.
        for digest, data in items:
            path = self._path(digest)
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        if items:
            os.sync()

    def has(self, digest: str) -> bool:
        return self._path(digest).exists()

    def get(self, digest: str) -> bytes:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFound(
                f"no blob with digest {digest[:12]}…",
                hint="upload it first (bundles are uploaded by the client before submit)",
                details={"digest": digest},
                code="blob_not_found",
            ) from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            # Bit rot or tampering: never hand out content under the wrong name.
            raise BundleError(
                f"stored blob {digest[:12]}… is corrupt (content hashes to {actual[:12]}…)",
                hint=f"delete {path} and upload it again",
                details={"digest": digest, "actual": actual},
            )
        return data

    def size(self, digest: str) -> int:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError:
            raise NotFound(f"no blob with digest {digest[:12]}…", code="blob_not_found") from None


class _FileWriter(BlobWriter):
    """A temp file in the store's folder, hashed as it is written, renamed to its digest."""

    def __init__(self, store: LocalArtifactStore) -> None:
        self.store = store
        fd, name = tempfile.mkstemp(prefix=UPLOAD_PREFIX, dir=store.root)
        self._file: io.BufferedWriter | None = os.fdopen(fd, "wb")
        self._path = Path(name)
        self._hash = hashlib.sha256()
        self._lock = threading.Lock()

    def write(self, data: bytes | bytearray) -> None:
        with self._lock:
            if self._file is None:
                return  # discarded meanwhile (the client left or the body is too large)
            self._hash.update(data)
            self._file.write(data)
            self.size += len(data)

    def commit(self, digest: str | None = None) -> str:
        with self._lock:
            f, self._file = self._file, None
            if f is None:
                raise BlobDiscarded()
            kept = False
            try:
                actual = _as_claimed(self._hash.hexdigest(), digest)
                path = self.store._path(actual)
                if not path.exists():  # else the same content is stored already
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(self._path, path)
                    kept = True
                return actual
            finally:
                f.close()
                if not kept:
                    self._path.unlink(missing_ok=True)

    def discard(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
                self._path.unlink(missing_ok=True)


class MemoryArtifactStore(ArtifactStore):
    """An in-memory artifact store: a fake for tests and throwaway control planes."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put(self, data: bytes, digest: str | None = None) -> str:
        actual = hash_checked(data, digest)
        self._blobs[actual] = data
        return actual

    def has(self, digest: str) -> bool:
        return check_digest(digest) in self._blobs

    def get(self, digest: str) -> bytes:
        try:
            return self._blobs[check_digest(digest)]
        except KeyError:
            raise NotFound(f"no blob with digest {digest[:12]}…", code="blob_not_found") from None

    def size(self, digest: str) -> int:
        return len(self.get(digest))
