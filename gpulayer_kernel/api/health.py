"""``GET /api/v1/health`` (liveness) and ``GET /api/v1/ready`` (readiness): the two routes that
take no token, for container healthchecks and load balancers (docker/control-plane.Dockerfile's
``HEALTHCHECK`` calls /health).

``/health`` answers 200 ``Health`` (status, version, role) on the leader here and on a standby
(``ha/standby.py`` answers it there, with ``role: standby`` and any problem that would stop it
taking over), so a healthcheck never restarts a healthy standby. ``/ready`` answers 200 only
where requests are served: a standby answers it 503 ``not_leader``, so a load balancer sends
traffic to the leader alone. Both answer 503 ``shutting_down`` once their host has begun to
stop, so an orchestrator stops sending traffic before the socket closes. Inside a Jupyter server
they are mounted like the worker routes, behind the host's gate, so they answer 503 ``starting``
until the control plane there is ready. They tell an anonymous caller nothing a token protects:
no workers, jobs, tokens or paths; the version, the role, and the ids of the secrets keys the
server holds (an id is a hash prefix that opens nothing; it tells an operator whether a key file
reached every server during a rotation).
"""

from __future__ import annotations

import tornado.web

from ..errors import Unavailable
from .mixin import GLMixin
from .models import Health, Ready
from .ops import op


class PublicRoute(GLMixin, tornado.web.RequestHandler):
    """A route anyone may call: no token is read, so none can be refused (or leaked)."""

    def check_xsrf_cookie(self) -> None:
        """A GET that changes nothing and reads no cookie: there is nothing to forge."""

    def refuse_when_stopping(self) -> None:
        if self.ctx.stopping.is_set():
            raise Unavailable(
                "the server is shutting down",
                hint="retry against another replica, or after the restart",
                code="shutting_down",
            )


class HealthHandler(PublicRoute):
    route = "/health"

    @op(
        "is this control plane alive? No token needed; answers the version and the role "
        "(leader or standby)",
        answer=Health,
        public=True,
        errors=(503,),
    )
    async def get(self) -> Health:
        self.refuse_when_stopping()
        return Health(version=self.ctx.version, role="leader", keys=self.cp.secrets.held_key_ids())


class ReadyHandler(PublicRoute):
    route = "/ready"

    @op(
        "does this control plane serve requests? No token needed; a standby answers 503 "
        "not_leader (for load balancers)",
        answer=Ready,
        public=True,
        errors=(503,),
    )
    async def get(self) -> Ready:
        self.refuse_when_stopping()
        return Ready()
