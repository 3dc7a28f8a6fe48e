"""A standby ``gpulayer serve`` on PostgreSQL: answer "not the leader, ask there" until it leads.

While another process leads (``store/leadership.py``), a standby listens on its own address and
answers every request with 503 ``not_leader``, naming the leader's URL (``details.leader``) and a
``Retry-After``, so clients and workers given several URLs move to the leader at once; nothing
is read or written here. When the leader goes, ``Leadership.acquire`` returns: the standby stops
this listener and starts the real control plane on the same port (``cli/serve.py``), loading the
live state from the database, handing placed work out again and opening a new event epoch.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from .api.app import _url_host
from .store.leadership import Leadership

LEADER_CACHE = 1.0  # seconds a looked-up leader URL is reused


class NotLeaderHandler(tornado.web.RequestHandler):
    """Every route of a standby: 503 ``not_leader`` with the leader's URL."""

    def initialize(self, standby: StandbyServer) -> None:
        self.standby = standby

    async def _answer(self, *args: Any) -> None:
        leader = await self.standby.leader()
        self.set_status(503)
        self.set_header("Content-Type", "application/json")
        self.set_header("Retry-After", "1")
        self.set_header("Cache-Control", "no-store")
        body = {
            "code": "not_leader",
            "message": "this control plane is a standby"
            + (f"; the leader is {leader}" if leader else ""),
            "hint": "send requests to the leader: give clients and workers every URL "
            "(GPULAYER_URL=URL1,URL2; --server URL1,URL2) and they move on their own",
            "details": {"leader": leader, "retry_after": 1},
        }
        self.finish(json.dumps(body))

    get = head = post = put = delete = patch = _answer

    def check_xsrf_cookie(self) -> None:
        """Nothing is done here: no request to forge."""


class StandbyServer:
    """The listener of a standby; ``port`` is kept for the control plane that follows."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership
        self._server: tornado.httpserver.HTTPServer | None = None
        self._leader: tuple[float, str | None] = (0.0, None)
        self.port = 0
        self.url = ""

    async def leader(self) -> str | None:
        at, url = self._leader
        if time.monotonic() - at > LEADER_CACHE:
            try:
                url = await self.leadership.leader_url()
            except Exception:  # the database away: say no more than "not here"
                url = None
            self._leader = (time.monotonic(), url)
        return url

    async def start(self, host: str, port: int, ssl_options: Any = None) -> str:
        app = tornado.web.Application([(r".*", NotLeaderHandler, {"standby": self})])
        sockets = tornado.netutil.bind_sockets(port, host or None, family=socket.AF_UNSPEC)
        self._server = tornado.httpserver.HTTPServer(app, ssl_options=ssl_options)
        self._server.add_sockets(sockets)
        self.port = int(sockets[0].getsockname()[1])
        scheme = "https" if ssl_options else "http"
        self.url = f"{scheme}://{_url_host(host)}:{self.port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()
            await server.close_all_connections()
