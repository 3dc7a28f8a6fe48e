"""The Lab panel's API on a served control plane: the Jupyter server forwards it (issue 33).

When Jupyter starts with ``GPULAYER_URL`` (and ``GPULAYER_TOKEN``) set, its kernels use that
control plane (``gpulayer serve``, one URL or an active and its standbys) and the server extension
hosts none. The panel, the kernels' waiting notice and the sidebar badge still call
``{base_url}gpulayer/api/v1/...`` on their own Jupyter server, with Jupyter's login and XSRF
header (no GPUlayer token ever reaches the page). :class:`Upstream` forwards those calls, method,
path, query and body unchanged, with the configured token as ``Authorization: Bearer``, and hands
back the answer as it came: its status, its JSON (errors included, ``{"code", "message", "hint"}``)
and the headers the panel reads (``Date`` for its clock, ``Retry-After``).

- Long-polls (``events?wait=25``, ``logs?wait=``) wait upstream as long as they asked, plus a
  margin; one the browser drops is cancelled upstream too.
- A control plane that cannot be reached answers 503 ``server_unreachable`` naming its URL, which
  the panel's banner shows; with several URLs, a request moves on as the CLI's do
  (``ha/failover.py``).
- Worker routes (``/worker/...``) and the kernels' streams are not forwarded: workers and kernels
  reach the served control plane themselves.

Who acts upstream is the token's owner, for everyone the Jupyter server lets in: the same person
the kernels of this server act as (one token per user's server under JupyterHub, deploy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs, parse_qsl

import httpx
import tornado.web
from jupyter_server.base.handlers import APIHandler

from ..client.calls import IDEMPOTENCY_KEY, Req
from ..errors import GPUlayerError, InvalidInput, Unavailable
from ..wire.http import Wire

log = logging.getLogger("gpulayer.jupyter")

TIMEOUT = 60.0  # seconds a forwarded call may take, beyond the long-poll it asked for
MAX_WAIT = 300.0  # the longest long-poll forwarded (the servers cap theirs lower)
PASSED = tuple(range(400, 600))  # every error answer is the browser's to read, as it came
PASSED_BACK = ("Content-Type", "Retry-After", "Date", "Content-Disposition", "Cache-Control")


class Upstream:
    """The served control plane's URLs and token, and one kept-alive client per URL."""

    def __init__(self, urls: str, token: str) -> None:
        # GPUlayer's one HTTP client (wire/http.py): failover, pools, the token, the client
        # tunnel for the panel's polls. Every answer is handed back as it came (``PASSED``),
        # errors included: the panel reads their JSON.
        self.wire = Wire(urls, token or None, timeout=TIMEOUT, check_peer=False, tunnel="client")
        self._calls: set[asyncio.Task[Any]] = set()
        self.closing = False

    @property
    def url(self) -> str:
        return self.wire.url

    async def forward(
        self, method: str, path: str, query: str, body: bytes | None, headers: dict[str, str]
    ) -> httpx.Response:
        """One call, on the URL in use (moving on as ``Servers`` says); ``unreachable`` when
        none answers."""
        sent = {k: v for k, v in headers.items() if v}
        req = Req(
            method,
            path,
            params=parse_qsl(query, keep_blank_values=True),
            content=body,
            timeout=TIMEOUT + _wait(query),
            ok=PASSED,
            key=sent.pop(IDEMPOTENCY_KEY, None),
            headers=sent,
        )
        return await self.wire.send(req)

    def track(self, task: asyncio.Task[Any]) -> None:
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def close(self) -> None:
        """End the calls in flight (their browsers get 503 ``shutting_down``) and the clients."""
        self.closing = True
        for task in list(self._calls):
            task.cancel()
        with contextlib.suppress(Exception):
            await self.wire.aclose()


def _wait(query: str) -> float:
    """The long-poll's ``wait`` (seconds) a query asks for, capped."""
    try:
        return min(MAX_WAIT, max(0.0, float(parse_qs(query).get("wait", ["0"])[0])))
    except ValueError:
        return 0.0


class ProxyHandler(APIHandler):
    """Every user route of the API, forwarded (Jupyter's login and XSRF checked first)."""

    upstream: Upstream

    def initialize(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._call: asyncio.Task[httpx.Response] | None = None

    def on_connection_close(self) -> None:
        if self._call is not None:
            self._call.cancel()  # the browser went away: so does the long-poll upstream

    @tornado.web.authenticated
    async def get(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def post(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def put(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def patch(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def delete(self, path: str) -> None:
        await self._forward(path)

    async def _forward(self, path: str) -> None:
        req = self.request
        if path.startswith("worker/") or path == "worker":
            raise InvalidInput(
                "worker routes are not forwarded by the Jupyter server",
                hint=f"point the worker at the control plane itself: {self.upstream.url}",
                code="not_forwarded",
            )
        headers = {k: req.headers.get(k, "") for k in ("Content-Type", "Accept", "Idempotency-Key")}
        body = req.body if req.method in ("POST", "PUT", "PATCH") else None
        self._call = asyncio.ensure_future(
            self.upstream.forward(req.method or "GET", path, req.query, body, headers)
        )
        self.upstream.track(self._call)
        try:
            resp = await self._call
        except asyncio.CancelledError:
            if not self.upstream.closing:
                return  # the browser went away: nobody to answer
            raise Unavailable(
                "the server is shutting down",
                hint="retry in a moment (the Lab panel does this on its own)",
                code="shutting_down",
            ) from None
        finally:
            self._call = None
        self.set_status(resp.status_code, resp.reason_phrase or None)
        for name in PASSED_BACK:
            value = resp.headers.get(name)
            if value is not None:
                self.set_header(name, value)
        self.finish(resp.content)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A GPUlayer error as the API writes one (``{"code", "message", "hint", "details"}``)."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, GPUlayerError):
            self.set_status(exc.status)
            self.set_header("Content-Type", "application/json")
            self.finish(exc.to_json())
            return
        super().write_error(status_code, **kwargs)


def proxy_handlers(prefix: str, upstream: Upstream) -> list[tuple[str, type, dict[str, Any]]]:
    """The route that forwards ``{prefix}/...`` (the panel's API) to ``upstream``."""
    return [(prefix + r"/(.*)", ProxyHandler, {"upstream": upstream})]
