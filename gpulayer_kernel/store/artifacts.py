"""Content-addressed file storage (ADR 0008): files named by sha256, verified on every read."""

from __future__ import annotations

import abc
import hashlib
import os
import tempfile
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
    actual = hashlib.sha256(data).hexdigest()
    if claimed is not None and actual != check_digest(claimed):
        raise BundleError(
            f"content has sha256 {actual[:12]}…, not the {claimed[:12]}… it was sent as",
            hint="the upload was corrupted or altered; send it again",
            details={"expected": claimed, "actual": actual},
        )
    return actual


class LocalArtifactStore(ArtifactStore):
    """Files under ``root/ab/abcdef…``, written temp → fsync → rename: a crash leaves no half."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

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
