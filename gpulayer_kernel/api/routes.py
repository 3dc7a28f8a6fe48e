"""The route table of ``/api/v1`` and how a host mounts it.

As jupyter_server ends its handlers modules, ``default_handlers`` lists (route template, handler)
for every route; ``operations()`` lists every (template, method, handler, op), the table that
builds the server, ``openapi.json`` and the route tests (tests/security/test_route_auth.py checks
every operation against every kind of token).

A host mounts the user routes on its own base class (``user_handlers(ClientTokenAuth, ...)`` for
``gpulayer serve``, jupyter_server's ``APIHandler`` inside Jupyter) and the worker routes as they
are (``worker_handlers(...)``), with one ``ApiContext`` from ``make_context``.
"""

from __future__ import annotations

from typing import Any

import tornado.web

from .. import versions
from ..contracts import PROTOCOL
from ..controlplane import ControlPlane
from ..security import TokenService
from .context import ApiContext, package_version
from .dist import DistFileHandler, DistHandler
from .handlers import (
    ArtifactHandler,
    BundleHandler,
    EventCursorHandler,
    EventsHandler,
    JobArtifactHandler,
    JobCancelHandler,
    JobExplainHandler,
    JobHandler,
    JobLogsHandler,
    JobsHandler,
    JobWaitHandler,
    SecretHandler,
    SecretKeyHandler,
    SecretsHandler,
    StatusHandler,
    TokenRevokeHandler,
    TokensHandler,
    WorkerHandler,
    WorkersHandler,
    WorkerStateHandler,
)
from .health import HealthHandler, ReadyHandler
from .job_runs import JobBatchHandler, JobFollowHandler, JobRunHandler
from .job_tokens import live_job_owner
from .kernels import USER_ROUTES as KERNEL_ROUTES
from .kernels import WORKER_ROUTES as KERNEL_WORKER_ROUTES
from .mixin import GLMixin
from .observe import AuditHandler, MetricsHandler
from .openapi import OpenApiHandler
from .ops import Operation, operations_of
from .params import ApiLimits, route_pattern
from .people import QuotaHandler, QuotasHandler, UserHandler, UsersHandler, WhoAmIHandler
from .provider_routes import (
    BudgetHandler,
    BudgetsHandler,
    CostsHandler,
    InstancesHandler,
    ProvidersHandler,
)
from .sessions import USER_ROUTES as SESSION_ROUTES
from .sessions import WORKER_ROUTES as SESSION_WORKER_ROUTES
from .worker_routes import (
    FinishedHandler,
    HeartbeatHandler,
    JoinHandler,
    LeaveHandler,
    LogsHandler,
    ProgressHandler,
    RendezvousHandler,
    ReportsHandler,
    StartedHandler,
    WorkerBlobHandler,
    WorkerRoute,
    WorkHandler,
)
from .workspace import USER_ROUTES as WORKSPACE_ROUTES
from .workspace import WORKER_ROUTES as WORKSPACE_WORKER_ROUTES

USER_ROUTES: tuple[type[GLMixin], ...] = (
    StatusHandler,
    JobsHandler,
    JobRunHandler,  # before JobHandler: "run" and "batch" are no job ids, and match first
    JobBatchHandler,
    JobHandler,
    JobFollowHandler,
    JobCancelHandler,
    JobLogsHandler,
    JobWaitHandler,
    JobExplainHandler,
    JobArtifactHandler,
    BundleHandler,
    ArtifactHandler,
    WorkersHandler,
    WorkerHandler,
    WorkerStateHandler,
    EventsHandler,
    EventCursorHandler,
    TokensHandler,
    TokenRevokeHandler,
    SecretsHandler,
    SecretKeyHandler,  # before SecretHandler: "rotate-key" is no secret name, and matches first
    SecretHandler,
    *SESSION_ROUTES,
    *KERNEL_ROUTES,
    *WORKSPACE_ROUTES,
    ProvidersHandler,
    InstancesHandler,
    CostsHandler,
    BudgetsHandler,
    BudgetHandler,
    OpenApiHandler,
    WhoAmIHandler,
    UsersHandler,
    UserHandler,
    QuotasHandler,
    QuotaHandler,
    MetricsHandler,
    AuditHandler,
)

WORKER_ROUTES: tuple[type[WorkerRoute], ...] = (
    JoinHandler,
    HeartbeatHandler,
    WorkHandler,
    StartedHandler,
    LogsHandler,
    ProgressHandler,
    FinishedHandler,
    ReportsHandler,
    RendezvousHandler,
    WorkerBlobHandler,
    LeaveHandler,
    *SESSION_WORKER_ROUTES,
    *KERNEL_WORKER_ROUTES,
    *WORKSPACE_WORKER_ROUTES,
    DistHandler,
    DistFileHandler,
)

# No token at all: only GET /health and /ready (tests/security/test_route_auth.py holds the list).
PUBLIC_ROUTES: tuple[type[GLMixin], ...] = (HealthHandler, ReadyHandler)

# The route table, as jupyter_server ends its handlers modules: (route template, handler).
default_handlers: list[tuple[str, type[GLMixin]]] = [
    (h.route, h) for h in (*USER_ROUTES, *WORKER_ROUTES, *PUBLIC_ROUTES)
]


def operations() -> list[Operation]:
    """(route template, method, handler, op) for every operation: the route table."""
    return operations_of([h for _, h in default_handlers])


# -- mounting ----------------------------------------------------------------------------------

HandlerSpec = tuple[str, type[tornado.web.RequestHandler], dict[str, Any]]
_COMPOSED: dict[tuple[type[GLMixin], type[tornado.web.RequestHandler]], type[GLMixin]] = {}


def compose(mixin: type[GLMixin], base: type[tornado.web.RequestHandler]) -> type[GLMixin]:
    """``class X(mixin, base)``, made once per pair (the mixin comes first in the MRO)."""
    key = (mixin, base)
    if key not in _COMPOSED:
        _COMPOSED[key] = type(mixin.__name__, (mixin, base), {"__module__": mixin.__module__})
    return _COMPOSED[key]


def make_context(
    cp: ControlPlane,
    tokens: TokenService,
    *,
    limits: ApiLimits | None = None,
    version: str | None = None,
    protocol: str = PROTOCOL,
) -> ApiContext:
    """The context of one mount, with the whole route table (which openapi.json describes);
    ``protocol`` "1.0" mounts only what a server before 1.1 had."""
    if version is None:
        version = package_version()
    if tokens is not None and tokens.users is None and cp is not None:
        tokens.users = cp.users  # client tokens act as their users (and a disabled one, not)
    if tokens is not None and tokens.audit is None and cp is not None:
        tokens.audit = cp.audit.record  # token creation and revocation are audited
    if tokens is not None and tokens.jobs.owner_of is None and cp is not None:
        tokens.jobs.owner_of = live_job_owner(cp)  # a job token works while its job does (ADR 0022)
    speaks = versions.parse(protocol)
    return ApiContext(
        cp=cp,
        tokens=tokens,
        limits=limits or ApiLimits(),
        version=version,
        operations=tuple(o for o in operations() if _serves(speaks, o.handler)),
        protocol=protocol,
    )


def _serves(speaks: versions.Version, handler: type[tornado.web.RequestHandler]) -> bool:
    """Whether a mount speaking ``speaks`` has this route (1.1's are new)."""
    return getattr(handler, "since", versions.OLDEST) <= speaks


def user_handlers(
    base_class: type[tornado.web.RequestHandler],
    prefix: str,
    cp: ControlPlane,
    tokens: TokenService,
    *,
    context: ApiContext | None = None,
) -> list[HandlerSpec]:
    """User routes on ``base_class`` (``ClientTokenAuth``, or jupyter_server's ``APIHandler``).

    Pass the same ``context`` to ``worker_handlers`` so one ``context.drain()`` ends every
    long-poll of the mount when its host stops.
    """
    ctx = context or make_context(cp, tokens)
    speaks = versions.parse(ctx.protocol)
    return [
        (route_pattern(prefix, h.route), compose(h, base_class), {"ctx": ctx})
        for h in USER_ROUTES
        if _serves(speaks, h)
    ]


def worker_handlers(
    prefix: str, cp: ControlPlane, tokens: TokenService, *, context: ApiContext | None = None
) -> list[HandlerSpec]:
    """Worker routes (GPUlayer worker tokens only) and the public ``/health``: complete handlers
    that do their own authentication, mounted as they are whichever host mounts them."""
    ctx = context or make_context(cp, tokens)
    speaks = versions.parse(ctx.protocol)
    return [
        (route_pattern(prefix, h.route), h, {"ctx": ctx})
        for h in (*WORKER_ROUTES, *PUBLIC_ROUTES)
        if _serves(speaks, h)
    ]
