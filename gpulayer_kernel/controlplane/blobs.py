"""Who may read which blob: a user the blobs they uploaded or their jobs made; admins, viewers any.

Bundles and artifacts share one content-addressed store, so a digest alone would let anyone who
learns it read someone else's code or results. The store keeps ``(digest, user)`` pairs: an
upload claims its digest for its uploader, a finished job's artifacts are claimed for its owner.
An unclaimed digest answers 404 like a missing one (no oracle for "does someone have this file").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from ..contracts import Job
from ..errors import NotFound
from ..security.roles import Identity, Role, check_role, resolved, sees_all
from ..store import ArtifactStore, MetadataStore
from ..store.artifacts import hash_checked

# Blobs up to this size are hashed on the loop (tens of microseconds) to find them stored already.
SMALL = 64 << 10


class Blobs:
    """Reads and writes blobs on behalf of a caller, claiming what they upload."""

    def __init__(self, store: MetadataStore, artifacts: ArtifactStore) -> None:
        self.store = store
        self.artifacts = artifacts

    async def upload(
        self, data: bytes, digest: str | None, *, who: Identity | None
    ) -> tuple[str, Awaitable[None]]:
        """Store ``data``, its uploader's claim queued but not awaited: the write its caller makes
        next commits with it (a run's bundle and its job: one transaction, not two)."""
        check_role(who, Role.USER, "upload")
        if len(data) <= SMALL and self.artifacts.has(known := hash_checked(data, digest)):
            digest = known  # stored already (a cell run again): no thread hop, no write
        else:
            digest = await asyncio.to_thread(self.artifacts.put, data, digest)
        return digest, self.claim(digest, who=who)

    def claim(self, digest: str, *, who: Identity | None) -> Awaitable[None]:
        """Queued before this returns (see ``MetadataStore.add_blob_owners``)."""
        return self.store.add_blob_owners([(digest, resolved(who).user)])

    async def made_by(self, job: Job) -> None:
        """A finished job's artifacts are its owner's to read."""
        if job.artifacts:
            await self.store.add_blob_owners([(a.digest, job.owner) for a in job.artifacts])

    async def readable(self, digest: str, who: Identity | None) -> bool:
        return sees_all(who) or await self.store.blob_owned(digest, resolved(who).user)

    async def has(self, digest: str, *, who: Identity | None) -> bool:
        return self.artifacts.has(digest) and await self.readable(digest, who)

    async def get(self, digest: str, *, who: Identity | None) -> bytes:
        if not await self.readable(digest, who):
            raise NotFound(
                f"no blob {digest[:12]}… of yours",
                hint="blobs are read through the jobs that made them (`gpulayer show JOB`)",
                details={"digest": digest},
                code="blob_not_found",
            )
        return await asyncio.to_thread(self.artifacts.get, digest)
