"""The rows of provisioning and accounting (store migrations 5, 7): instances, costs, budgets,
and the cluster's own facts (its id, the providers config its leader runs).

A mixin of ``SqlStore`` (it uses its group commit, ``_write``, and its reads), so SQLite and
PostgreSQL share it (the migration is portable SQL: PostgreSQL widens its types): the tables keep
each record's contract as a JSON body beside the columns queries filter on, as ``jobs`` and
``workers`` do. Cost rows are keyed by ``(job_id, attempt, kind)`` and written with an upsert, so
the same estimate or charge written twice is one row: the ledger is idempotent by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..contracts import Budget, CostEntry, Instance

MIGRATION = (
    5,
    "provider instances, the cost ledger, budgets",
    """
    CREATE TABLE instances (
        id TEXT PRIMARY KEY, provider TEXT NOT NULL, state TEXT NOT NULL,
        requested_at REAL NOT NULL, body TEXT NOT NULL);
    CREATE INDEX instances_state ON instances(state);
    CREATE TABLE costs (
        job_id TEXT NOT NULL, attempt INTEGER NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL,
        amount REAL NOT NULL, body TEXT NOT NULL, PRIMARY KEY (job_id, attempt, kind))
        WITHOUT ROWID;
    CREATE INDEX costs_at ON costs(at);
    CREATE TABLE budgets (name TEXT PRIMARY KEY, body TEXT NOT NULL);
    """,
)
# The cluster's facts, one row each, written once (``claim``) or by the leader: the cluster id
# that tags every machine GPUlayer launches (so whichever server leads finds them all, ADR 0010),
# and the providers config the last leader ran (a server given another one is told, not silent).
CLUSTER_MIGRATION = (
    7,
    "the cluster: its id, the providers config its leader runs",
    """
    CREATE TABLE cluster (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
)
ENDED = ("terminated", "failed", "preempted")

_UPSERT_INSTANCE = (
    "INSERT INTO instances (id, provider, state, requested_at, body) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(id) DO UPDATE SET state=excluded.state, body=excluded.body"
)
UPSERT_COST = (
    "INSERT INTO costs (job_id, attempt, kind, at, amount, body) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(job_id, attempt, kind) DO UPDATE SET at=excluded.at, amount=excluded.amount, "
    "body=excluded.body"
)


def cost_row(e: CostEntry) -> tuple[Any, ...]:
    return (e.job_id, e.attempt, e.kind.value, e.at, e.amount, e.model_dump_json())


class ProvisioningRows:
    """Instances, cost rows and budgets (mixed into ``SqlStore``)."""

    if TYPE_CHECKING:  # SqlStore's group commit and reads

        async def _write(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None: ...

        async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    async def save_instances(self, instances: Sequence[Instance]) -> None:
        await self._write(
            _UPSERT_INSTANCE,
            [
                (i.id, i.provider, i.state.value, i.requested_at, i.model_dump_json())
                for i in instances
            ],
        )

    async def load_instances(self, *, ended: bool = False, limit: int = 1000) -> list[Instance]:
        sql = "SELECT body FROM instances"
        params: list[Any] = []
        if not ended:
            sql += f" WHERE state NOT IN ({','.join('?' * len(ENDED))})"
            params.extend(ENDED)
        sql += " ORDER BY requested_at DESC LIMIT ?"
        params.append(limit)
        return [Instance.model_validate_json(r[0]) for r in await self._fetchall(sql, params)]

    async def claim_cluster_value(self, name: str, value: str) -> str:
        """The cluster fact ``name``: ``value`` if none was stored, else the one stored first
        (two servers claiming at once agree: the insert that lost changes nothing)."""
        await self._write(
            "INSERT INTO cluster (name, value) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
            [(name, value)],
        )
        rows = await self._fetchall("SELECT value FROM cluster WHERE name = ?", (name,))
        return str(rows[0][0])

    async def get_cluster_value(self, name: str) -> str | None:
        rows = await self._fetchall("SELECT value FROM cluster WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    async def set_cluster_value(self, name: str, value: str) -> None:
        await self._write(
            "INSERT INTO cluster (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value=excluded.value",
            [(name, value)],
        )

    async def save_costs(self, entries: Sequence[CostEntry]) -> None:
        await self._write(UPSERT_COST, [cost_row(e) for e in entries])

    async def list_costs(
        self, since: float | None = None, job_id: str | None = None
    ) -> list[CostEntry]:
        where: list[str] = []
        params: list[Any] = []
        if since is not None:
            where.append("at >= ?")
            params.append(since)
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        sql = "SELECT body FROM costs" + (" WHERE " + " AND ".join(where) if where else "")
        rows = await self._fetchall(sql + " ORDER BY at, job_id, attempt, kind", params)
        return [CostEntry.model_validate_json(r[0]) for r in rows]

    async def save_budget(self, budget: Budget) -> None:
        await self._write(
            "INSERT INTO budgets (name, body) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET body=excluded.body",
            [(budget.name, budget.model_dump_json())],
        )

    async def load_budgets(self) -> list[Budget]:
        rows = await self._fetchall("SELECT body FROM budgets ORDER BY name")
        return [Budget.model_validate_json(r[0]) for r in rows]

    async def delete_budget(self, name: str) -> bool:
        existed = bool(await self._fetchall("SELECT 1 FROM budgets WHERE name = ?", (name,)))
        await self._write("DELETE FROM budgets WHERE name = ?", [(name,)])
        return existed
