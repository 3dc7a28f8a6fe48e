"""Packs: many files' contents in one zstd stream, each named by its sha256 and checked on read.

A pack is what one request carries (up to ``PACK_BYTES`` of content): ``zstd(header, bytes,
header, bytes, ...)`` where each header is ``<digest hex 64><size: 16 hex>``. zstd at level 1
(measured here: 614 MB/s on CSV text at 8.8×, 1.35 GB/s through random bytes) costs less than
it saves on anything but a fast local link. :func:`unpack` verifies every object's digest: a
pack can never place bytes under a name they do not hash to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import zstandard

from ..errors import BundleError

PACK_BYTES = 32 << 20  # content per request: progress steps, bounded memory on each side
LEVEL = 1
_HEAD = 64 + 16


def pack(objects: Iterable[tuple[str, bytes]]) -> bytes:
    """One pack of ``(digest, data)`` pairs."""
    c = zstandard.ZstdCompressor(level=LEVEL)
    chunks = []
    for digest, data in objects:
        chunks.append(f"{digest}{len(data):016x}".encode())
        chunks.append(data)
    return c.compress(b"".join(chunks))


def unpack(blob: bytes, limit: int = 1 << 34) -> Iterator[tuple[str, bytes]]:
    """The ``(digest, data)`` pairs of a pack, each verified; BundleError on anything wrong."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise BundleError(f"a workspace pack is not valid zstd: {exc}") from None
    view = memoryview(raw)
    at = 0
    while at < len(view):
        head = bytes(view[at : at + _HEAD])
        if len(head) < _HEAD:
            raise BundleError("a workspace pack ends inside a header")
        try:
            digest, size = head[:64].decode("ascii"), int(head[64:], 16)
        except ValueError:
            raise BundleError("a workspace pack has a malformed header") from None
        at += _HEAD
        data = bytes(view[at : at + size])
        if len(data) != size:
            raise BundleError(f"a workspace pack ends inside object {digest[:12]}…")
        at += size
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise BundleError(
                f"workspace object {digest[:12]}… has sha256 {got[:12]}…: refused",
                hint="the file changed on its way or the pack was damaged; it is sent again",
            )
        yield digest, data


def batches(sizes: Iterable[tuple[str, int]], limit: int = PACK_BYTES) -> list[list[str]]:
    """Digests grouped so that each group's content is about ``limit`` bytes (at least one)."""
    out: list[list[str]] = []
    cur: list[str] = []
    n = 0
    for digest, size in sizes:
        if cur and n + size > limit:
            out.append(cur)
            cur, n = [], 0
        cur.append(digest)
        n += size
    if cur:
        out.append(cur)
    return out
