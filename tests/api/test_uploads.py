"""Uploads stream to disk (issue 12, item 5): digests, limits, the concurrent-upload cap, and a
client that leaves mid-body, against a real server in this loop; the memory check runs against a
real ``gpulayer serve`` (tests/api/test_upload_memory.py)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.api import ApiLimits
from gpulayer_kernel.testing import until

from .conftest import Api, running_api, sha

LIMIT = 1 << 20


def leftovers(tmp_path: Path) -> list[Path]:
    """Upload temp files still in the artifact store's folder."""
    return list((tmp_path / "blobs").glob(".upload-*"))


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    limits = ApiLimits(
        max_bundle=LIMIT,
        max_blob=2 * LIMIT,
        drain_max=4 * LIMIT,
        max_uploads=2,
        upload_buffer=64 << 10,
    )
    async with running_api(tmp_path, limits=limits) as a:
        yield a


def uploads(api: Api) -> int:
    return api.server.context.uploads


async def test_an_exact_digest_upload_is_stored_and_reads_back(api: Api, tmp_path: Path) -> None:
    data = os.urandom(LIMIT)  # 16 batches of upload_buffer: several writes, one file
    r = await api.call("PUT", f"/bundles/{sha(data)}", content=data)
    assert r.status_code == 201, r.text
    assert r.json() == {"api_version": "gpulayer/v1", "digest": sha(data), "size": len(data)}
    assert (await api.call("GET", f"/bundles/{sha(data)}")).content == data
    assert (await api.call("GET", f"/artifacts/{sha(data)}")).content == data
    # The same content again: accepted, stored once.
    r = await api.call("PUT", f"/bundles/{sha(data)}", content=data)
    assert r.status_code == 201
    assert leftovers(tmp_path) == [] and uploads(api) == 0
    # Chunked (no Content-Length) streams the same way.
    piece = os.urandom(100_000)

    async def pieces() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield piece

    r = await api.http.put(
        f"{api.base}/bundles/{sha(piece * 5)}",
        content=pieces(),
        headers={"Authorization": f"Bearer {api.client_token}"},
    )
    assert r.status_code == 201, r.text
    assert api.cp.artifacts.get(sha(piece * 5)) == piece * 5


async def test_a_digest_mismatch_is_422_and_stores_nothing(api: Api, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    claimed = sha(b"something else")
    r = await api.call("PUT", f"/bundles/{claimed}", content=data)
    assert r.status_code == 422 and r.json()["code"] == "bundle_invalid"
    assert r.json()["details"] == {"expected": claimed, "actual": sha(data)}
    assert not api.cp.artifacts.has(claimed) and not api.cp.artifacts.has(sha(data))
    assert leftovers(tmp_path) == [] and uploads(api) == 0
    r = await api.call("PUT", "/bundles/not-a-digest", content=data)
    assert r.status_code == 400 and r.json()["code"] == "invalid_input"
    assert leftovers(tmp_path) == [] and uploads(api) == 0


async def test_one_byte_over_the_bundle_limit_is_413(api: Api, tmp_path: Path) -> None:
    data = b"x" * (LIMIT + 1)
    # Declared up front: refused before any of it is stored.
    r = await api.call("PUT", f"/bundles/{sha(data)}", content=data)
    assert r.status_code == 413 and r.json()["code"] == "body_too_large"
    assert r.json()["details"] == {"limit": LIMIT}
    # Chunked: refused the moment the count passes the limit; the rest is drained unread.

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield data[: LIMIT // 2]

    r = await api.http.put(
        f"{api.base}/bundles/{sha(data)}",
        content=chunks(),
        headers={"Authorization": f"Bearer {api.client_token}"},
    )
    assert r.status_code == 413 and r.json()["code"] == "body_too_large"
    assert leftovers(tmp_path) == [] and uploads(api) == 0
    # Exactly the limit is fine, and the connection survived the refusals.
    r = await api.call("PUT", f"/bundles/{sha(data[:LIMIT])}", content=data[:LIMIT])
    assert r.status_code == 201
    # A worker's artifact upload has its own (here larger) limit, and streams the same way.
    _, session = await api.join("w1")
    r = await api.call("PUT", f"/worker/blobs/{sha(data)}", session, content=data)
    assert r.status_code == 201 and api.cp.artifacts.has(sha(data))
    big = b"y" * (2 * LIMIT + 1)
    r = await api.call("PUT", f"/worker/blobs/{sha(big)}", session, content=big)
    assert r.status_code == 413 and r.json()["details"] == {"limit": 2 * LIMIT}
    assert leftovers(tmp_path) == [] and uploads(api) == 0


async def test_uploads_beyond_the_cap_get_503_with_retry_after(api: Api, tmp_path: Path) -> None:
    gate = asyncio.Event()
    first = b"a" * 1000

    def held(rest: bytes) -> AsyncIterator[bytes]:
        async def body() -> AsyncIterator[bytes]:
            yield first
            await gate.wait()
            yield rest

        return body()

    auth = {"Authorization": f"Bearer {api.client_token}"}
    slow = [
        asyncio.ensure_future(
            api.http.put(
                f"{api.base}/bundles/{sha(first + rest)}", content=held(rest), headers=auth
            )
        )
        for rest in (b"1", b"2")
    ]
    await until(lambda: uploads(api) == 2, what="two uploads to hold both slots")
    data = b"third"
    r = await api.call("PUT", f"/bundles/{sha(data)}", content=data)
    assert r.status_code == 503 and r.json()["code"] == "uploads_busy"
    assert r.headers["retry-after"] == "1"
    assert r.json()["details"] == {"max_uploads": 2, "retry_after": 1}
    # Reads and other routes are not held up by uploads.
    assert (await api.call("GET", "/status")).status_code == 200
    gate.set()
    assert [r.status_code for r in await asyncio.gather(*slow)] == [201, 201]
    assert uploads(api) == 0
    r = await api.call("PUT", f"/bundles/{sha(data)}", content=data)
    assert r.status_code == 201
    assert leftovers(tmp_path) == []


async def test_a_client_leaving_mid_upload_frees_its_slot_and_file(
    api: Api, tmp_path: Path
) -> None:
    host, port = api.url.removeprefix("http://").rsplit(":", 1)
    digest = hashlib.sha256(b"never finished").hexdigest()
    head = (
        f"PUT /api/v1/bundles/{digest} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {api.client_token}\r\nContent-Length: {LIMIT}\r\n\r\n"
    ).encode()
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"z" * 200_000)  # more than one upload_buffer: a temp file exists
    await writer.drain()
    await until(lambda: leftovers(tmp_path) != [], what="the upload's temp file")
    assert uploads(api) == 1
    writer.close()  # mid-body
    await writer.wait_closed()
    await until(
        lambda: uploads(api) == 0 and leftovers(tmp_path) == [],
        what="the slot and the temp file to be given back",
    )
    assert (await api.call("GET", "/status")).status_code == 200


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_the_artifact_stores_take_a_blob_in_pieces(tmp_path: Path, kind: str) -> None:
    from gpulayer_kernel.errors import BundleError
    from gpulayer_kernel.store import LocalArtifactStore, MemoryArtifactStore
    from gpulayer_kernel.store.artifacts import BlobDiscarded

    store = LocalArtifactStore(tmp_path / "blobs") if kind == "local" else MemoryArtifactStore()
    w = store.writer()
    w.write(b"hello ")
    w.write(bytearray(b"world"))
    assert w.size == 11
    assert w.commit(sha(b"hello world")) == sha(b"hello world")
    assert store.get(sha(b"hello world")) == b"hello world"
    w = store.writer()
    w.write(b"tampered")
    with pytest.raises(BundleError):
        w.commit(sha(b"original"))
    assert not store.has(sha(b"tampered"))
    w = store.writer()
    w.write(b"abandoned")
    w.discard()
    w.discard()  # idempotent
    with pytest.raises(BlobDiscarded):
        w.commit()
    assert not store.has(sha(b"abandoned"))
    if kind == "local":
        assert leftovers(tmp_path) == []


def test_an_upload_left_by_a_crash_is_swept_a_day_later(tmp_path: Path) -> None:
    from gpulayer_kernel.store import LocalArtifactStore
    from gpulayer_kernel.store.artifacts import STALE_UPLOAD_SECONDS

    root = tmp_path / "blobs"
    root.mkdir()
    old, recent = root / ".upload-old", root / ".upload-recent"
    old.write_bytes(b"x")
    recent.write_bytes(b"y")
    then = old.stat().st_mtime - STALE_UPLOAD_SECONDS - 60
    os.utime(old, (then, then))
    LocalArtifactStore(root)
    assert not old.exists() and recent.exists()  # a recent one may be another process's upload
