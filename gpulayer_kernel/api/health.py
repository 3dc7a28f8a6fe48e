"""``GET /api/v1/health``: the one route that takes no token, for container healthchecks and load
balancers (docker/control-plane.Dockerfile's ``HEALTHCHECK`` calls it).

It answers 200 ``Health`` (status and version) while the API serves, and 503 ``shutting_down``
once its host has begun to stop, so an orchestrator stops sending traffic before the socket
closes. Inside a Jupyter server it is mounted like the worker routes, behind the host's gate, so
it answers 503 ``starting`` until the control plane there is ready. It tells an anonymous caller
nothing a token protects: no workers, jobs, tokens or paths; the version only, which ``/status``
shows every client anyway.
"""

from __future__ import annotations

import tornado.web

from ..errors import Unavailable
from .mixin import GLMixin
from .models import Health
from .ops import op


class PublicRoute(GLMixin, tornado.web.RequestHandler):
    """A route anyone may call: no token is read, so none can be refused (or leaked)."""

    def check_xsrf_cookie(self) -> None:
        """A GET that changes nothing and reads no cookie: there is nothing to forge."""


class HealthHandler(PublicRoute):
    route = "/health"

    @op(
        "is this API serving? No token needed; answers the version only",
        answer=Health,
        public=True,
        errors=(503,),
    )
    async def get(self) -> Health:
        if self.ctx.stopping.is_set():
            raise Unavailable(
                "the server is shutting down",
                hint="retry against another replica, or after the restart",
                code="shutting_down",
            )
        return Health(version=self.ctx.version)
