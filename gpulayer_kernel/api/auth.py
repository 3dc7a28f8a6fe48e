"""Who may call what: the two authenticating bases that the handler mixins are mounted on.

User routes are mounted on a host's base class: ``ClientTokenAuth`` under ``gpulayer serve`` (a
GPUlayer client token as ``Authorization: Bearer``), or jupyter_server's ``APIHandler`` inside a
Jupyter server (Jupyter's own login, cookies and XSRF). Worker routes always use
``WorkerTokenAuth``: each operation names the token kinds it accepts (``@op(kinds=...)``), and a
worker session token is bound to its worker. Tokens are read only from the header, never the URL.

A user route's caller is ``GLMixin.who`` (an ``Identity``): the host base sets ``gl_who`` from
its credential (here: the client token's user and role; inside Jupyter: jupyter_server's
IdentityProvider, see ``jupyter/extension.py``).
"""

from __future__ import annotations

import tornado.web

from ..client.calls import ENROLMENT
from ..errors import Forbidden
from ..security import Principal, TokenKind
from .context import ApiContext
from .ops import op_of


def bearer_of(request: tornado.httputil.HTTPServerRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("bearer", "token") and value.strip():
        return value.strip()
    return None


class ClientTokenAuth(tornado.web.RequestHandler):
    """Base for user routes under ``gpulayer serve``: a client token sets ``current_user``."""

    ctx: ApiContext

    async def prepare(self) -> None:
        if self.request.method == "OPTIONS":
            return
        principal: Principal = await self.ctx.tokens.authenticate(
            bearer_of(self.request), (TokenKind.CLIENT, TokenKind.JOB)
        )
        if principal.kind == TokenKind.JOB and "/tokens" in self.request.path:
            raise Forbidden(
                "a job token cannot make, list or revoke tokens",
                hint="it acts for one job only (docs/security.md); use a client token",
                code="job_token_scope",
            )
        self.current_user = principal
        self.gl_who = principal.identity

    def check_xsrf_cookie(self) -> None:
        """Bearer tokens only, never cookies: there is no cross-site request to forge."""


class WorkerTokenAuth(tornado.web.RequestHandler):
    """Base for worker routes (in both hosts): the operation's token kinds, from the header."""

    ctx: ApiContext
    principal: Principal | None = None

    async def prepare(self) -> None:
        spec = op_of(getattr(self, (self.request.method or "").lower(), None))
        if spec is None or spec.kinds is None:
            return  # unknown method: the mixin answers 405
        self.principal = await self.ctx.tokens.authenticate(
            bearer_of(self.request), spec.kinds, enrolment=self.request.headers.get(ENROLMENT)
        )

    def check_xsrf_cookie(self) -> None:
        """Worker routes never read cookies, so Jupyter's XSRF cookie check does not apply."""

    @property
    def worker_id(self) -> str:
        assert self.principal is not None and self.principal.worker_id is not None
        return self.principal.worker_id
