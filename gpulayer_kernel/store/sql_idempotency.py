"""The idempotency keys of keyed writes (store migration 6, ADR 0003): request and answer.

A mixin of ``SqlStore`` (its group commit and reads), so SQLite and PostgreSQL share it; the
migration is portable SQL. One row per (user, key): the request's fingerprint, the answer once
there is one, and the jobs the request created. A job's note is *queued* (``queue_idempotency``)
before the job's own row, so it commits in the same transaction as the job or before it: a
server killed after the job is stored always finds the note too, and a retry gets that job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from .base import IdempotencyRecord

MIGRATION = (
    6,
    "idempotency keys of keyed writes",
    """
    CREATE TABLE idempotency_keys (
        owner TEXT NOT NULL, idem_key TEXT NOT NULL, fingerprint TEXT NOT NULL,
        created_at REAL NOT NULL, status INTEGER, answer TEXT, jobs TEXT NOT NULL,
        PRIMARY KEY (owner, idem_key)) WITHOUT ROWID;
    CREATE INDEX idempotency_keys_created ON idempotency_keys(created_at);
    """,
)

_UPSERT = (
    "INSERT INTO idempotency_keys (owner, idem_key, fingerprint, created_at, status, answer, jobs) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(owner, idem_key) DO UPDATE SET "
    "fingerprint=excluded.fingerprint, created_at=excluded.created_at, status=excluded.status, "
    "answer=excluded.answer, jobs=excluded.jobs"
)
_COLUMNS = "owner, idem_key, fingerprint, created_at, status, answer, jobs"


def _row(r: IdempotencyRecord) -> tuple[Any, ...]:
    return (r.owner, r.key, r.fingerprint, r.created_at, r.status, r.answer, json.dumps(r.jobs))


class IdempotencyRows:
    """Idempotency keys (mixed into ``SqlStore``)."""

    if TYPE_CHECKING:  # SqlStore's group commit and reads

        async def _write(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None: ...

        def _ride(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[None]: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def queue_idempotency(self, record: IdempotencyRecord) -> Awaitable[None]:
        # Queued now, with no await: it rides in the next group commit, ahead of any write queued
        # after it (the job it notes). The caller need not await it; the job's commit is its own.
        return self._ride(_UPSERT, [_row(record)])

    async def save_idempotency(self, record: IdempotencyRecord) -> None:
        await self.queue_idempotency(record)

    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None:
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM idempotency_keys WHERE owner = ? AND idem_key = ?",
            (owner, key),
        )
        if not rows:
            return None
        o, k, fingerprint, created_at, status, answer, jobs = rows[0]
        return IdempotencyRecord(
            owner=o,
            key=k,
            fingerprint=fingerprint,
            created_at=float(created_at),
            status=None if status is None else int(status),
            answer=answer,
            jobs=tuple(json.loads(jobs)),
        )

    async def delete_idempotency(self, owner: str, key: str) -> None:
        await self._write(
            "DELETE FROM idempotency_keys WHERE owner = ? AND idem_key = ?", [(owner, key)]
        )

    async def purge_idempotency(self, before: float) -> None:
        await self._write("DELETE FROM idempotency_keys WHERE created_at < ?", [(before,)])
