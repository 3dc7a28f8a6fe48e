"""The routes an operator watches the control plane through (ADR 0020, docs/operations.md).

``GET /api/v1/metrics``: Prometheus' text exposition of the control plane's registry
(``controlplane/metrics.py``). It takes a client token with at least the viewer role, like every
read of the cluster's state: metrics name no user and no job, but they do tell how busy the
cluster is. Give Prometheus a viewer token of a service user (docs/operations.md).

``GET /api/v1/audit``: a page of the audit log, newest first, for admins; ``before`` (the last
row's seq) pages on. A page is at most 1000 rows: exports are bounded.
"""

from __future__ import annotations

import tornado.web

from ..controlplane.audit import MAX_PAGE, AuditPage
from ..controlplane.metrics import CONTENT_TYPE
from ..security.roles import Role
from .mixin import GLMixin
from .ops import op
from .params import Param


class MetricsHandler(GLMixin):
    route = "/metrics"

    @op(
        "Prometheus metrics (text exposition format 0.0.4): jobs, queue and waits, scheduling "
        "passes, request latency per route, workers, GPUs, sessions, store commits, ledger",
        answer="bytes",
        role=Role.VIEWER,
    )
    async def get(self) -> None:
        body = self.cp.metrics.exposition()
        self.set_header("Content-Type", CONTENT_TYPE)
        self.set_header("Cache-Control", "no-store")
        # Straight to tornado: the mixin's answers are JSON or octet-stream, a JSON-only base
        # (APIHandler) would relabel it, and Prometheus reads the type to pick its parser.
        await tornado.web.RequestHandler.finish(self, body)


class AuditHandler(GLMixin):
    route = "/audit"

    @op(
        "the audit log, newest first: who submitted, cancelled, stopped or attached, changed "
        "roles, quotas, budgets, tokens or secrets (names and ids only); admins only",
        answer=AuditPage,
        query=(
            Param("user", "string", None, description="only this user's actions", max_length=64),
            Param("action", "string", None, description="only this action, e.g. job.submit"),
            Param("since", "number", None, 0, 1e11, "epoch seconds: rows recorded from then"),
            Param("before", "integer", None, 1, None, "rows older than this seq (paging)"),
            Param("limit", "integer", 100, 1, MAX_PAGE, f"rows per page (at most {MAX_PAGE})"),
        ),
        errors=(400,),
        role=Role.ADMIN,
    )
    async def get(
        self,
        user: str | None,
        action: str | None,
        since: float | None,
        before: float | None,
        limit: float,
    ) -> AuditPage:
        return await self.cp.audit.page(
            user=user,
            action=action,
            since=since,
            before=None if before is None else int(before),
            limit=int(limit),
            who=self.who,
        )
