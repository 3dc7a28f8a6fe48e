"""The HTTP API ``/api/v1`` (docs/api-routes.md): tornado handlers, auth, errors, OpenAPI.

Mount it standalone with ``make_app``/``ApiServer`` (``gpulayer serve``), or inside a Jupyter
server with ``user_handlers(APIHandler, prefix, cp, tokens, context=ctx)`` plus
``worker_handlers(prefix, cp, tokens, context=ctx)`` where ``ctx = make_context(cp, tokens)``.
"""

from __future__ import annotations

from ._base import ApiContext, ApiLimits, GLMixin, Op, Param, op
from .app import PREFIX, ApiServer, make_app
from .auth import ClientTokenAuth, WorkerTokenAuth
from .handlers import (
    USER_ROUTES,
    default_handlers,
    make_context,
    user_handlers,
    worker_handlers,
)
from .openapi import build_openapi, operations
from .worker_routes import WORKER_ROUTES

__all__ = [
    "PREFIX",
    "USER_ROUTES",
    "WORKER_ROUTES",
    "ApiContext",
    "ApiLimits",
    "ApiServer",
    "ClientTokenAuth",
    "GLMixin",
    "Op",
    "Param",
    "WorkerTokenAuth",
    "build_openapi",
    "default_handlers",
    "make_app",
    "make_context",
    "op",
    "operations",
    "user_handlers",
    "worker_handlers",
]
