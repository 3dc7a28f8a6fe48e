"""GPUlayer's one HTTP client (issue 34): how every caller sends a request to a control plane.

The clients (``AsyncClient``, ``Client``), the worker's transport (``worker/http.py``) and the
Jupyter host's kernel link (``kernels/link.py``) all describe a request as a :class:`Req`
(``client/calls.py``: method, path, query, body, its own timeout, an idempotency key) and send it
through a :class:`Wire` (or :class:`SyncWire`, for the blocking client). A wire holds:

- the control plane's URLs and the failover rule (``ha/failover.py``: past a hung or standby
  server within seconds, a keyed or repeatable request sent again where that is harmless);
- one kept-alive connection pool per URL, with the TLS rule (``client/httpbase.py``);
- the caller's credential (a token, or a function of one: a worker's session token changes when
  it re-joins) and the protocol this side speaks (``GPUlayer-Protocol``), on every request;
- the one error mapping: an answer of 400 or more becomes the exception it stands for
  (``errors.from_json``), a server that cannot be reached ``Unavailable``
  (``server_unreachable``), a server of another major protocol version is refused.

A :data:`~gpulayer_kernel.client.calls.Call` (a generator that yields requests and receives
responses) runs on a wire with ``run``; a single request goes with ``send``. Streams (the kernels'
WebSockets) are ``wire/stream.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from .. import versions
from ..client.calls import Call, Req
from ..client.httpbase import error_from, http_client, unreachable
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import PROTOCOL
from ..ha.failover import Sends, Servers, send, send_sync
from ..security.tls import check_url

if TYPE_CHECKING:
    from .tunnel import Side, Tunnel

T = TypeVar("T")
Credential = str | Callable[[], str | None] | None


class _Base:
    """What both wires share: the URLs, the credential, the headers, the error mapping."""

    def __init__(
        self,
        urls: str | list[str],
        credential: Credential = None,
        *,
        ca_cert: str | None = None,
        timeout: float = 30.0,
        check_peer: bool = True,
    ) -> None:
        self.servers = Servers(urls)
        for u in self.servers.urls:
            check_url(u)
        self.credential = credential
        self.ca_cert = ca_cert
        self.timeout = timeout
        self.check_peer = check_peer
        self.heard: Callable[[httpx.Response], None] | None = None  # the caller's ear

    @property
    def url(self) -> str:
        return self.servers.url

    def headers(self, req: Req, token: str | None) -> dict[str, str]:
        headers = {versions.HEADER: PROTOCOL}
        token = token or (self.credential() if callable(self.credential) else self.credential)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if req.minimal:
            headers["Prefer"] = "return=minimal"  # a 1.1 server answers 204, an older ignores it
        return headers

    def kwargs(self, req: Req, token: str | None) -> dict[str, Any]:
        kw = req.send_kwargs()
        kw.pop("timeout", None)  # ``Servers.timeout`` decides, from the request's own
        kw["headers"] = {**self.headers(req, token), **kw.get("headers", {})}
        return kw

    def answer(self, req: Req, outcome: httpx.Response | httpx.TransportError) -> httpx.Response:
        if isinstance(outcome, httpx.TransportError):
            raise unreachable(self.servers.url, outcome) from None
        if self.heard is not None:
            self.heard(outcome)
        said = outcome.headers.get(versions.HEADER)
        if said is not None and self.check_peer:
            versions.peer(said, peer_is=f"the control plane at {self.servers.url}")
        if outcome.status_code >= 400 and outcome.status_code not in req.ok:
            raise error_from(outcome)
        return outcome


class Wire(_Base):
    """The asyncio wire (see the module docstring)."""

    def __init__(
        self,
        urls: str | list[str],
        credential: Credential = None,
        *,
        ca_cert: str | None = None,
        timeout: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
        check_peer: bool = True,
        tunnel: Side | None = None,
    ) -> None:
        """``tunnel``: send that side's small requests on its tunnel where the control plane
        has one: ``"worker"`` (a worker's transport) or ``"client"`` (the clients)."""
        super().__init__(urls, credential, ca_cert=ca_cert, timeout=timeout, check_peer=check_peer)
        self.clock = clock
        self._pools: dict[str, httpx.AsyncClient] = {}
        # Small requests on one WebSocket per URL (``wire/tunnel.py``), where served.
        self.tunnel = tunnel
        self._tunnels: dict[str, Tunnel] = {}

    def pool(self) -> httpx.AsyncClient:
        """The kept-alive connection pool of the URL in use (one per URL, made on first use)."""
        url = self.servers.url
        if url not in self._pools:
            http = http_client(url, ca_cert=self.ca_cert, timeout=self.timeout, asynchronous=True)
            assert isinstance(http, httpx.AsyncClient)
            self._pools[url] = http
        return self._pools[url]

    def sender(self) -> Sends:
        """What sends a request to the URL in use: its pool, or its tunnel before its pool."""
        if self.tunnel is None:
            return self.pool()
        from .tunnel import Tunnel, Tunneled  # on first use: most wires have no tunnel

        url = self.servers.url
        if url not in self._tunnels:
            credential = self.credential
            token = credential if callable(credential) else lambda: credential
            self._tunnels[url] = Tunnel(url, token, ca_cert=self.ca_cert, side=self.tunnel)
        return Tunneled(self._tunnels[url], self.pool())

    async def send(self, req: Req, *, token: str | None = None) -> httpx.Response:
        """One request, failing over as ``ha/failover.py`` says; ``token``: this request's own
        credential (a worker's join token)."""
        outcome = await send(
            self.servers,
            self.sender,
            req.method,
            req.path,
            default=self.timeout,
            own=req.timeout,
            keyed=req.key is not None or req.repeatable,
            sleep=self.clock.sleep,
            now=self.clock.monotonic,
            **self.kwargs(req, token),
        )
        return self.answer(req, outcome)

    async def run(self, call: Call[T]) -> T:
        """Drive a call to its value: each request it yields is sent, its answer sent back."""
        try:
            req = next(call)
            while True:
                req = call.send(await self.send(req))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        tunnels, self._tunnels = self._tunnels, {}
        await asyncio.gather(
            *(p.aclose() for p in pools.values()), *(t.aclose() for t in tunnels.values())
        )


class SyncWire(_Base):
    """The blocking wire, for the synchronous ``Client`` (off any event loop)."""

    def __init__(
        self,
        urls: str | list[str],
        credential: Credential = None,
        *,
        ca_cert: str | None = None,
        timeout: float = 30.0,
        check_peer: bool = True,
    ) -> None:
        super().__init__(urls, credential, ca_cert=ca_cert, timeout=timeout, check_peer=check_peer)
        self._pools: dict[str, httpx.Client] = {}

    def pool(self) -> httpx.Client:
        url = self.servers.url
        if url not in self._pools:
            http = http_client(url, ca_cert=self.ca_cert, timeout=self.timeout, asynchronous=False)
            assert isinstance(http, httpx.Client)
            self._pools[url] = http
        return self._pools[url]

    def send(self, req: Req, *, token: str | None = None) -> httpx.Response:
        outcome = send_sync(
            self.servers,
            self.pool,
            req.method,
            req.path,
            default=self.timeout,
            own=req.timeout,
            keyed=req.key is not None or req.repeatable,
            **self.kwargs(req, token),
        )
        return self.answer(req, outcome)

    def run(self, call: Call[T]) -> T:
        try:
            req = next(call)
            while True:
                req = call.send(self.send(req))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def close(self) -> None:
        pools, self._pools = self._pools, {}
        for p in pools.values():
            p.close()
