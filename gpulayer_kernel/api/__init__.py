"""The HTTP API ``/api/v1`` (docs/api-routes.md): tornado handlers, auth, errors, OpenAPI.

Mount it standalone with ``make_app``/``ApiServer`` (``gpulayer serve``), or inside a Jupyter
server with ``user_handlers(APIHandler, prefix, cp, tokens, context=ctx)`` plus
``worker_handlers(prefix, cp, tokens, context=ctx)`` where ``ctx = make_context(cp, tokens)``.

Modules: ``params`` (limits, query and path parameters) → ``ops`` (the ``@op`` declaration) →
``context`` → ``longpoll`` and ``mixin`` (``GLMixin``, what every handler does) → ``handlers``
(user routes), ``worker_routes``, ``openapi`` → ``routes`` (the table and mounting) → ``app``.
"""

from __future__ import annotations

from .app import PREFIX, ApiServer, make_app
from .auth import ClientTokenAuth, WorkerTokenAuth
from .context import ApiContext
from .mixin import GLMixin
from .openapi import build_openapi
from .ops import Op, Operation, op, op_of
from .params import ApiLimits, Param
from .routes import (
    PUBLIC_ROUTES,
    USER_ROUTES,
    WORKER_ROUTES,
    HandlerSpec,
    default_handlers,
    make_context,
    operations,
    user_handlers,
    worker_handlers,
)

__all__ = [
    "PREFIX",
    "PUBLIC_ROUTES",
    "USER_ROUTES",
    "WORKER_ROUTES",
    "ApiContext",
    "ApiLimits",
    "ApiServer",
    "ClientTokenAuth",
    "GLMixin",
    "HandlerSpec",
    "Op",
    "Operation",
    "Param",
    "WorkerTokenAuth",
    "build_openapi",
    "default_handlers",
    "make_app",
    "make_context",
    "op",
    "op_of",
    "operations",
    "user_handlers",
    "worker_handlers",
]
