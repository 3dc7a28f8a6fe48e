"""The audit log and tokens' last use (store migration 8, ADR 0020).

A mixin of ``SqlStore`` (its group commit and reads), so SQLite and PostgreSQL share it; the
migration is portable SQL. The audit log is append-only: the code has an INSERT and reads, no
UPDATE or DELETE. An entry is *queued* (``queue_audit``) with no await, so it rides in the group
commit that carries the action's own rows (a submit's job): no extra round trip, and an
acknowledged action always has its entry. Rows are numbered by the control plane (``seq``, read
back at start), so both stores page them the same way.

Tokens' last use lives in its own small table rather than in ``tokens``: the token service
writes it at most once a minute per token, and an upsert of one narrow row is the cheapest
write there is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from .base import AuditEntry, AuditQuery

MIGRATION = (
    8,
    "the audit log, tokens' last use",
    """
    CREATE TABLE audit_log (
        seq INTEGER PRIMARY KEY, at REAL NOT NULL, actor TEXT NOT NULL, role TEXT,
        action TEXT NOT NULL, target TEXT NOT NULL, detail TEXT NOT NULL);
    CREATE INDEX audit_log_actor ON audit_log(actor, seq);
    CREATE INDEX audit_log_action ON audit_log(action, seq);
    CREATE INDEX audit_log_at ON audit_log(at);
    CREATE TABLE token_uses (token_id TEXT PRIMARY KEY, last_used REAL NOT NULL);
    """,
)

_INSERT = (
    "INSERT INTO audit_log (seq, at, actor, role, action, target, detail) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_TOUCH = (
    "INSERT INTO token_uses (token_id, last_used) VALUES (?, ?) "
    "ON CONFLICT(token_id) DO UPDATE SET last_used=excluded.last_used"
)
_COLUMNS = "seq, at, actor, role, action, target, detail"


class AuditRows:
    """The audit log and tokens' last use (mixed into ``SqlStore``)."""

    if TYPE_CHECKING:  # SqlStore's group commit and reads

        def _ride(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[None]: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def queue_audit(self, entry: AuditEntry) -> Awaitable[None]:
        # Queued now, no await: it commits with the next group (the action's own rows). A failed
        # commit fails the action's own write too, which is what its caller learns of.
        e = entry
        row = (e.seq, e.at, e.actor, e.role, e.action, e.target, json.dumps(e.detail))
        return self._ride(_INSERT, [row])

    async def max_audit_seq(self) -> int:
        rows = await self._fetchall("SELECT MAX(seq) FROM audit_log")
        return int(rows[0][0] or 0) if rows else 0

    async def list_audit(self, query: AuditQuery) -> tuple[list[AuditEntry], int]:
        """Entries newest first (``before``: older than that seq), and how many match in all."""
        where: list[str] = []
        params: list[object] = []
        if query.actor is not None:
            where.append("actor = ?")
            params.append(query.actor)
        if query.action is not None:
            where.append("action = ?")
            params.append(query.action)
        if query.since is not None:
            where.append("at >= ?")
            params.append(query.since)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        total = await self._fetchall(f"SELECT COUNT(*) FROM audit_log{clause}", params)
        if query.before is not None:
            clause += " AND seq < ?" if where else " WHERE seq < ?"
            params.append(query.before)
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM audit_log{clause} ORDER BY seq DESC LIMIT ?",
            [*params, query.limit],
        )
        entries = [
            AuditEntry(
                seq=int(r[0]),
                at=float(r[1]),
                actor=r[2],
                role=r[3],
                action=r[4],
                target=r[5],
                detail=json.loads(r[6]),
            )
            for r in rows
        ]
        return entries, int(total[0][0])

    def queue_token_use(self, token_id: str, at: float) -> Awaitable[None]:
        return self._ride(_TOUCH, [(token_id, at)])

    async def token_uses(self) -> dict[str, float]:
        rows = await self._fetchall("SELECT token_id, last_used FROM token_uses")
        return {r[0]: float(r[1]) for r in rows}
