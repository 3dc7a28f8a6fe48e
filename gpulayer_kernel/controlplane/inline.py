"""Small bundles handed out with their assignments (protocol 1.1): the worker need not fetch them.

A notebook cell's bundle is a few hundred bytes; fetching it is one more request per cell on a
worker that has not seen that source yet. ``Work`` carries the bundles (base64) of the
assignments it hands a worker that says 1.1, when they are at most :data:`MAX_INLINE` bytes.
The bytes come from a small LRU of recently stored or sent bundles (no disk read, no hash) or,
once, from the artifact store (read and verified in a thread).
"""

from __future__ import annotations

import asyncio
import base64
from collections import OrderedDict

from ..contracts import Work
from ..store import ArtifactStore

MAX_INLINE = 256 << 10  # the worker keeps bundles up to this size in memory too
HELD_BYTES = 16 << 20


class InlineBundles:
    """Recently used small bundles, by digest; what ``Work`` carries inline."""

    def __init__(self, artifacts: ArtifactStore) -> None:
        self.artifacts = artifacts
        self._held: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def keep(self, digest: str, data: bytes) -> None:
        """A bundle just stored (its digest checked by whoever stored it)."""
        if len(data) > MAX_INLINE or digest in self._held:
            return
        self._held[digest] = data
        self._bytes += len(data)
        while self._bytes > HELD_BYTES:
            _, dropped = self._held.popitem(last=False)
            self._bytes -= len(dropped)

    async def get(self, digest: str) -> bytes | None:
        """The bundle's bytes if it is small enough to send inline (None otherwise)."""
        data = self._held.get(digest)
        if data is not None:
            self._held.move_to_end(digest)
            return data
        try:
            if self.artifacts.size(digest) > MAX_INLINE:
                return None
            data = await asyncio.to_thread(self.artifacts.get, digest)
        except Exception:  # gone or unreadable: the worker fetches it and is told why
            return None
        self.keep(digest, data)
        return data

    async def attach(self, work: Work) -> Work:
        """``work`` with the small bundles of its assignments inline."""
        found: dict[str, str] = {}
        for a in work.assignments:
            digest = getattr(a.job.spec.workload, "bundle", None)
            if digest is None or digest in found:
                continue
            data = await self.get(digest)
            if data is not None:
                found[digest] = base64.b64encode(data).decode()
        return work.model_copy(update={"bundles": found}) if found else work
