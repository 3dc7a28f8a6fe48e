"""The audit log (ADR 0020): who did what, appended as it happens, read by admins.

``AuditLog.record`` queues one row with no await: it rides in the group commit that carries the
action's own write (a submit's job row), so an action costs no extra round trip and an
acknowledged action has its row. Rows hold names and ids and small facts (a role, a count),
never a secret's value or a token's text: ``record`` refuses detail keys that could carry one.
The log is append-only; nothing in the code updates or deletes a row.

Actions (``ACTIONS``) are stable strings ``<thing>.<verb>``: filter on them
(``gpulayer audit --action job.submit``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final

from pydantic import Field

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Contract
from ..errors import InvalidInput
from ..security.roles import Identity, Role, check_role, resolved
from ..store import AuditEntry, AuditQuery, MetadataStore

ACTIONS: Final = (
    "job.submit",
    "job.cancel",
    "session.attach",
    "session.stop",
    "user.add",
    "user.update",
    "quota.set",
    "budget.set",
    "budget.delete",
    "token.create",
    "token.revoke",
    "secret.set",
    "secret.delete",
    "secret.rotate_key",
)
MAX_PAGE = 1000  # rows one read returns at most: exports page through the rest
_NEVER = frozenset({"value", "secret", "token", "text", "password"})  # keys a detail never has


class AuditRow(Contract):
    """One audit log row: who did what to which thing, and small facts (never a secret)."""

    seq: int
    at: float
    user: str
    role: str | None = None
    action: str
    target: str
    detail: dict[str, object] = Field(default_factory=dict)


class AuditPage(Contract):
    """A page of the audit log, newest first (``GET /api/v1/audit``)."""

    entries: list[AuditRow]
    total: int = Field(description="rows matching the filters, in all")
    next_before: int | None = Field(
        None, description="pass as `before` for the next (older) page; None: this was the last"
    )


class AuditLog:
    """Numbers, queues and reads audit rows; the store keeps them (``store/sql_audit.py``)."""

    def __init__(self, store: MetadataStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self.seq = 0

    async def load(self) -> None:
        """Carry on the numbering (at start: the new leader continues the old one's)."""
        self.seq = max(self.seq, await self.store.max_audit_seq())

    def record(
        self, who: Identity | None, action: str, target: str, **detail: object
    ) -> Awaitable[None]:
        """Queue one row (no await); awaiting the result waits for its commit."""
        assert action in ACTIONS, action  # a new action is added to ACTIONS and the docs
        leaked = _NEVER.intersection(detail)
        assert not leaked, f"audit detail must not carry {sorted(leaked)}"
        me = resolved(who)
        self.seq += 1
        return self.store.queue_audit(
            AuditEntry(
                seq=self.seq,
                at=self.clock.now(),
                actor=me.user,
                role=me.role.value,
                action=action,
                target=target,
                detail=detail,
            )
        )

    async def query(
        self,
        *,
        user: str | None = None,
        action: str | None = None,
        since: float | None = None,
        before: int | None = None,
        limit: int = 100,
        who: Identity | None = None,
    ) -> tuple[list[AuditEntry], int]:
        """A page of rows, newest first, and how many match in all; admins only."""
        check_role(who, Role.ADMIN, "read the audit log")
        if action is not None and action not in ACTIONS:
            raise InvalidInput(
                f"{action!r} is no audit action",
                hint=f"one of: {', '.join(ACTIONS)}",
                details={"action": action},
                code="audit_action",
            )
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput(
                f"limit {limit} is out of range (1 to {MAX_PAGE})",
                hint="page through a longer log with 'before' (the last row's seq)",
                details={"limit": limit, "max": MAX_PAGE},
                code="audit_limit",
            )
        return await self.store.list_audit(
            AuditQuery(actor=user, action=action, since=since, before=before, limit=limit)
        )

    async def page(
        self,
        *,
        user: str | None = None,
        action: str | None = None,
        since: float | None = None,
        before: int | None = None,
        limit: int = 100,
        who: Identity | None = None,
    ) -> AuditPage:
        """``query`` as the API answers it: rows, the total, where the next page starts."""
        entries, total = await self.query(
            user=user, action=action, since=since, before=before, limit=limit, who=who
        )
        rows = [
            AuditRow(
                seq=e.seq,
                at=e.at,
                user=e.actor,
                role=e.role,
                action=e.action,
                target=e.target,
                detail=e.detail,
            )
            for e in entries
        ]
        more = len(rows) == limit and rows[-1].seq > 1
        return AuditPage(entries=rows, total=total, next_before=rows[-1].seq if more else None)
