"""Fakes over the real SQLite store for the control plane's tests (no mock): one that fails whole
transactions while it is ``down``."""

from __future__ import annotations

from collections.abc import Sequence

from gpulayer_kernel.errors import Unavailable
from gpulayer_kernel.store import SqliteStore
from gpulayer_kernel.store.group import Run


class AwayStore(SqliteStore):
    """SQLite whose transactions fail while ``down``, every write in them (a restarting or
    failing-over database, as the store sees it)."""

    down = False

    async def _commit(self, queue: Sequence[Run]) -> None:
        if self.down:
            raise Unavailable("the database is away (on purpose)")
        await super()._commit(queue)
