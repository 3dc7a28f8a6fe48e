"""Who may read which blob: a user the blobs they uploaded or their jobs made; admins, viewers any.

Bundles and artifacts share one content-addressed store, so a digest alone would let anyone who
learns it read someone else's code or results. The store keeps ``(digest, user)`` pairs: an
upload claims its digest for its uploader, a finished job's artifacts are claimed for its owner.
An unclaimed digest answers 404 like a missing one (no oracle for "does someone have this file").
"""

from __future__ import annotations

import asyncio

from ..contracts import Job
from ..errors import NotFound
from ..security.roles import Identity, Role, check_role, resolved, sees_all
from ..store import ArtifactStore, MetadataStore


class Blobs:
    """Reads and writes blobs on behalf of a caller, claiming what they upload."""

    def __init__(self, store: MetadataStore, artifacts: ArtifactStore) -> None:
        self.store = store
        self.artifacts = artifacts

    async def put(self, data: bytes, digest: str | None, *, who: Identity | None) -> str:
        check_role(who, Role.USER, "upload")
        digest = await asyncio.to_thread(self.artifacts.put, data, digest)
        await self.claim(digest, who=who)
        return digest

    async def claim(self, digest: str, *, who: Identity | None) -> None:
        await self.store.add_blob_owners([(digest, resolved(who).user)])

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
