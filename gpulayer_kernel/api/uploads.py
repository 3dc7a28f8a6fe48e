"""Uploads at the HTTP edge: a raw body streams to disk as it arrives, never whole in memory.

An ``Upload`` holds one of the mount's ``ApiLimits.max_uploads`` slots (a request beyond them is
``503 uploads_busy`` with ``Retry-After``) and a ``BlobWriter`` of the artifact store: a temp file
beside the blobs, hashed as it is written, renamed to its digest at ``commit``. At most
``upload_buffer`` bytes wait in memory; each batch is written and hashed in a worker thread, and
tornado reads no more of the body until it is done (flow control), so a slow disk slows the
client instead of filling the server's memory.
"""

from __future__ import annotations

import asyncio

from ..errors import Unavailable
from ..store.artifacts import ArtifactStore, BlobDiscarded, BlobWriter
from .context import ApiContext
from .longpoll import ClientGone
from .models import BlobStored

RETRY_AFTER = 1  # seconds a client is asked to wait when every upload slot is taken


class Upload:
    """One raw request body on its way into the artifact store."""

    def __init__(self, ctx: ApiContext, writer: BlobWriter) -> None:
        self.ctx = ctx
        self.writer = writer
        self.size = 0
        self._buffer = bytearray()
        self._open = True

    @classmethod
    def open(cls, ctx: ApiContext, store: ArtifactStore) -> Upload:
        """Take an upload slot and a writer; ``Unavailable`` when every slot is taken."""
        if ctx.uploads >= ctx.limits.max_uploads:
            raise Unavailable(
                f"{ctx.uploads} uploads are in progress, the most this server takes at once",
                hint=f"retry in {RETRY_AFTER}s (the answer's Retry-After header)",
                details={"max_uploads": ctx.limits.max_uploads, "retry_after": RETRY_AFTER},
                code="uploads_busy",
            )
        upload = cls(ctx, store.writer())  # the slot is taken only once the file exists
        ctx.uploads += 1
        return upload

    async def write(self, chunk: bytes) -> None:
        """Add a piece of the body; a full buffer goes to disk before the next piece is read."""
        self.size += len(chunk)
        self._buffer += chunk
        if len(self._buffer) >= self.ctx.limits.upload_buffer:
            await self._flush()

    async def _flush(self) -> None:
        if self._buffer:
            data, self._buffer = self._buffer, bytearray()
            await asyncio.to_thread(self.writer.write, data)

    async def commit(self, digest: str) -> BlobStored:
        """Store the body under ``digest`` (BundleError 422 when its sha256 differs)."""
        await self._flush()
        try:
            stored = await asyncio.to_thread(self.writer.commit, digest)
        except BlobDiscarded:
            raise ClientGone() from None  # the client left meanwhile: its body was dropped
        finally:
            self.close()
        return BlobStored(digest=stored, size=self.size)

    def close(self) -> None:
        """Give the slot back and drop whatever was not committed (idempotent)."""
        if self._open:
            self._open = False
            self._buffer = bytearray()
            self.ctx.uploads -= 1
            self.writer.discard()
