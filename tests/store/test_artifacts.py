"""Content-addressed artifact store: named by sha256, verified on read, atomic writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpulayer_kernel.errors import BundleError, InvalidInput, NotFound
from gpulayer_kernel.store import ArtifactStore, LocalArtifactStore, MemoryArtifactStore


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    return LocalArtifactStore(tmp_path / "a") if request.param == "local" else MemoryArtifactStore()


def test_put_get_has(store: ArtifactStore) -> None:
    digest = store.put(b"hello")
    assert digest == hashlib.sha256(b"hello").hexdigest()
    assert store.has(digest)
    assert store.get(digest) == b"hello"
    assert store.size(digest) == 5
    assert store.put(b"hello", digest) == digest  # idempotent


def test_wrong_claimed_digest_is_refused(store: ArtifactStore) -> None:
    with pytest.raises(BundleError, match="not the"):
        store.put(b"hello", hashlib.sha256(b"other").hexdigest())


def test_missing_and_malformed_digests(store: ArtifactStore) -> None:
    with pytest.raises(NotFound):
        store.get("0" * 64)
    with pytest.raises(InvalidInput):
        store.get("../../etc/passwd")


def test_corruption_on_disk_is_detected(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "a")
    digest = store.put(b"precious")
    (tmp_path / "a" / digest[:2] / digest).write_bytes(b"rotten")
    with pytest.raises(BundleError, match="corrupt"):
        store.get(digest)


def test_no_temporary_files_are_left(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "a")
    for i in range(5):
        store.put(f"blob {i}".encode())
    assert not [p for p in (tmp_path / "a").rglob(".tmp-*")]
