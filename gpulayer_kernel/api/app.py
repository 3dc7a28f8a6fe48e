"""The standalone host: a tornado Application for ``gpulayer serve`` and an ``ApiServer`` to run it.

``make_app(cp, tokens)`` mounts the user routes on ``ClientTokenAuth`` and the worker routes under
``/api/v1``; ``ApiServer`` binds it (127.0.0.1 and a random port by default), applies the TLS rule,
and on ``stop()`` ends every long-poll before closing connections.
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from .. import versions
from ..contracts import PROTOCOL
from ..controlplane import ControlPlane
from ..errors import ConfigInvalid
from ..ha.failover import ROLE_HEADER
from ..security import TokenService, check_serve
from .auth import ClientTokenAuth
from .context import ApiContext
from .errors import error_body, loggable_path
from .params import ApiLimits
from .routes import make_context, user_handlers, worker_handlers
from .streams import close_streams, stream_handlers

PREFIX = "/api/v1"
access_log = logging.getLogger("gpulayer.access")


class JSONNotFound(tornado.web.RequestHandler):
    """Any path outside the routes: a JSON 404 like every other error (and, as every answer,
    with the protocol this server speaks: a 1.1 client tells it from an older server's)."""

    def set_default_headers(self) -> None:
        self.set_header(versions.HEADER, PROTOCOL)
        self.set_header(ROLE_HEADER, "leader")

    def prepare(self) -> None:
        raise tornado.web.HTTPError(404)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        body = error_body(status_code, "no such route")
        self.finish(tornado.escape.json_encode(body))

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        """A 404 is not worth a log line of its own (the access log has it)."""


def _log_request(handler: tornado.web.RequestHandler) -> None:
    """Access log without query strings: nothing secret travels there, and we keep it that way."""
    status = handler.get_status()
    # Refused credentials are worth a warning; other 4xx are answers (a missing bundle is 404).
    level = (
        logging.ERROR
        if status >= 500
        else logging.WARNING
        if status in (401, 403, 413)
        else logging.INFO
    )
    access_log.log(
        level,
        "%d %s %s %.1fms",
        status,
        handler.request.method,
        loggable_path(handler.request.path),
        1000.0 * handler.request.request_time(),
    )


def make_app(
    cp: ControlPlane,
    tokens: TokenService,
    *,
    limits: ApiLimits | None = None,
    context: ApiContext | None = None,
    prefix: str = PREFIX,
    **settings: Any,
) -> tornado.web.Application:
    """The API as a tornado Application; its ApiContext is ``app.settings["gpulayer_context"]``."""
    ctx = context or make_context(cp, tokens, limits=limits)
    handlers = [
        *user_handlers(ClientTokenAuth, prefix, cp, tokens, context=ctx),
        *worker_handlers(prefix, cp, tokens, context=ctx),
        *stream_handlers(prefix, ctx, host=True),
    ]
    return tornado.web.Application(
        handlers,
        default_handler_class=JSONNotFound,
        log_function=_log_request,
        gpulayer_context=ctx,
        **settings,
    )


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class ApiServer:
    """Runs ``make_app`` on a socket; ``url`` is the base to give clients (without /api/v1)."""

    def __init__(
        self,
        cp: ControlPlane,
        tokens: TokenService,
        *,
        limits: ApiLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        heartbeat_interval: float | None = None,
        protocol: str = PROTOCOL,
    ) -> None:
        """``heartbeat_interval``: what joining workers are told (default a third of the
        control plane's heartbeat timeout). ``protocol`` "1.0": serve as a server from before
        1.1 did (for compatibility tests)."""
        if heartbeat_interval is not None and not 0 < heartbeat_interval < cp.heartbeat_timeout:
            # Workers told to beat less often than the timeout would be declared lost between
            # two beats, and their jobs with them (a test did that on a loaded machine).
            raise ConfigInvalid(
                f"heartbeat interval {heartbeat_interval}s must be above 0 and below the "
                f"control plane's heartbeat timeout ({cp.heartbeat_timeout}s)",
                hint="a third of the timeout is the default",
                details={
                    "heartbeat_interval": heartbeat_interval,
                    "heartbeat_timeout": cp.heartbeat_timeout,
                },
            )
        self.context = make_context(cp, tokens, limits=limits, protocol=protocol)
        self.context.heartbeat_interval = heartbeat_interval
        self.app = make_app(cp, tokens, context=self.context)
        self.ssl_context = ssl_context
        self._server: tornado.httpserver.HTTPServer | None = None
        self.url = ""
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        check_serve(host, "ssl" if self.ssl_context else None, "ssl" if self.ssl_context else None)
        limits = self.context.limits
        sockets = tornado.netutil.bind_sockets(port, host or None, family=socket.AF_UNSPEC)
        self._server = tornado.httpserver.HTTPServer(
            self.app,
            ssl_options=self.ssl_context,
            max_body_size=max(limits.max_blob, limits.max_bundle, limits.drain_max),
            idle_connection_timeout=3600,
            body_timeout=600,
        )
        self._server.add_sockets(sockets)
        self.port = int(sockets[0].getsockname()[1])
        scheme = "https" if self.ssl_context else "http"
        self.url = f"{scheme}://{_url_host(host)}:{self.port}"
        return self.url

    async def stop(self) -> None:
        """End long-polls (they answer 503 shutting_down), stop listening, close connections."""
        await self.context.drain()
        await close_streams(self.context)
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()
            await server.close_all_connections()
