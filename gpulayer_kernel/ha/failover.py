"""Several URLs of one control plane (an active and its standbys): which one to talk to, and when
to move on. Shared by the HTTP client and the worker's HTTP transport.

``GPULAYER_URL=https://a:8470,https://b:8470`` (or ``--server URL1,URL2``). A request moves to the
next URL when it certainly was not handled: the connection could not be made, or the server said
it is not the leader (503 ``not_leader``, naming the leader when it knows it), is starting or
stopping. A request whose connection broke mid-way moves only when repeating it is harmless
(GET, HEAD, PUT, DELETE, or a POST carrying an ``Idempotency-Key``: the server does it once and
replays its answer, ADR 0003); another POST then fails as before (``Unavailable``), since it may
have been applied. After a round over every URL it waits with backoff, up to ``failover_for``
seconds in all.

A keyed write is also sent again on any 503 (busy, restarting), and with one URL too: on a
broken or refused connection and on a 503 other than ``not_leader`` (which names no one else to
ask), with backoff (0.2 s doubling to 2 s) for up to ``failover_for`` seconds; the restart of a
lone server is ridden out. Other requests to one URL get their errors at once, as before.

A *hung* server (stopped, its process paused, its machine swapping) accepts connections and
never answers. With several URLs, each send therefore has a short connect timeout
(``CONNECT``) and, when repeating it is harmless, a short first-byte timeout (``FIRST_BYTE``):
a hung leader is passed within ~2 s, not after the whole request timeout. Each round over the
URLs doubles both (up to the request's own timeout), so a server that is only slow is still
waited for. A long-poll, a large upload or download keeps its own timeout (its answer comes
late on purpose). ``send`` is that loop (``send_sync`` for the blocking client).

Every answer of a GPUlayer server names its role in ``GPUlayer-Role`` (``leader`` or
``standby``), HEAD answers included, which carry no body: a 503 from a standby moves on by the
header when its body cannot be read (and to the leader its ``GPUlayer-Leader`` header names).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import httpx

from ..errors import InvalidInput

log = logging.getLogger("gpulayer.failover")

# The codes a server answers with when another server should take the request.
MOVE_CODES = frozenset({"not_leader", "shutting_down", "starting"})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
DEFAULT_FAILOVER_FOR = 30.0
ROLE_HEADER = "GPUlayer-Role"  # "leader" or "standby", on every answer of a GPUlayer server
LEADER_HEADER = "GPUlayer-Leader"  # a standby's answer: the leader's URL, when it knows it
CONNECT = 2.0  # seconds to connect to one of several URLs (doubled each round)
FIRST_BYTE = 2.0  # seconds one of several URLs gets to start answering (doubled each round)
LONE_CONNECT = 10.0  # the connect timeout with one URL: there is nowhere else to go


def split_urls(urls: str | Sequence[str]) -> list[str]:
    out = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u.strip()]
    if not out:
        raise InvalidInput("no server URL given", hint="pass --server URL or set GPULAYER_URL")
    return out


def _same(a: str, b: str) -> bool:
    return a.rstrip("/").removesuffix("/api/v1") == b.rstrip("/").removesuffix("/api/v1")


class Sends(Protocol):
    """What ``send`` sends through: an ``httpx.AsyncClient``, or a worker's tunnel before it
    (``request(method, path, timeout=..., **kwargs)``, as httpx's)."""

    @property
    def request(self) -> Callable[..., Awaitable[httpx.Response]]: ...


class Servers:
    """The URLs, the one in use, and the failover rule (see the module docstring)."""

    def __init__(
        self, urls: str | Sequence[str], *, failover_for: float = DEFAULT_FAILOVER_FOR
    ) -> None:
        self.urls = split_urls(urls)
        self.current = 0
        self.failover_for = failover_for

    @property
    def url(self) -> str:
        return self.urls[self.current]

    @property
    def several(self) -> bool:
        return len(self.urls) > 1

    def moves_on(
        self, method: str, outcome: BaseException | httpx.Response, *, keyed: bool = False
    ) -> bool:
        """Whether this outcome sends the request again (to the next URL, when there are
        several); ``keyed``: it carries an Idempotency-Key (see the module docstring)."""
        if isinstance(outcome, httpx.Response):
            if outcome.status_code != 503:
                return False
            code = _code(outcome)
            if self.several:
                return keyed or code in MOVE_CODES
            return keyed and code != "not_leader"
        if not (self.several or keyed):
            return False
        if isinstance(outcome, httpx.ConnectError | httpx.ConnectTimeout):
            return True
        repeatable = keyed or method.upper() in IDEMPOTENT
        return isinstance(outcome, httpx.TransportError) and repeatable

    def timeout(
        self, method: str, tries: int, *, default: float, own: float | None, keyed: bool = False
    ) -> httpx.Timeout:
        """The timeouts of send number ``tries`` (0: the first) of one request: ``own``, a
        long-poll's or transfer's, else ``default``; with several URLs, a short connect and (for
        a request that may be sent again) first-byte timeout, doubled each round."""
        total = own if own is not None else default
        if not self.several:
            return httpx.Timeout(total, connect=min(total, LONE_CONNECT))
        grow = 2 ** (tries // len(self.urls))
        connect = min(total, CONNECT * grow)
        if own is not None or not (keyed or method.upper() in IDEMPOTENT):
            # Its answer comes late on purpose, or sending it again might do it twice.
            return httpx.Timeout(total, connect=connect)
        return httpx.Timeout(total, connect=connect, read=min(total, FIRST_BYTE * grow))

    def move(self, outcome: BaseException | httpx.Response | None = None) -> None:
        """To the leader the answer named, if it is one of ours, else to the next URL."""
        was = self.url
        leader = _leader(outcome) if isinstance(outcome, httpx.Response) else None
        for i, url in enumerate(self.urls):
            if leader and _same(url, leader) and i != self.current:
                self.current = i
                break
        else:
            self.current = (self.current + 1) % len(self.urls)
        if isinstance(outcome, httpx.Response):
            why = f"{outcome.status_code} {_code(outcome)}".strip()
        else:
            why = type(outcome).__name__
        log.info("moving from %s to %s (%s)", was, self.url, why)

    def pause(self, tries: int) -> float:
        """Seconds to wait before try number ``tries`` (0 within the first round)."""
        rounds = tries // len(self.urls)
        return 0.0 if tries % len(self.urls) else min(2.0, 0.1 * 2**rounds) if rounds else 0.0


async def send(
    servers: Servers,
    pool: Callable[[], Sends],
    method: str,
    path: str,
    *,
    default: float,
    own: float | None = None,
    keyed: bool = False,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    now: Callable[[], float] = time.monotonic,
    **kwargs: Any,
) -> httpx.Response | httpx.TransportError:
    """Send one request over ``servers`` (``pool()``: the connection pool of the URL in use),
    moving on as the module docstring says; the last answer, or the error of the last send.
    ``own``: the request's own timeout (a long-poll's); ``sleep`` and ``now``: the caller's
    clock (a worker's may be a fake one)."""
    until = now() + servers.failover_for
    tries = 0
    while True:
        timeout = servers.timeout(method, tries, default=default, own=own, keyed=keyed)
        outcome: httpx.Response | httpx.TransportError
        try:
            outcome = await pool().request(method, path, timeout=timeout, **kwargs)
        except httpx.TransportError as exc:
            outcome = exc
        moves = isinstance(outcome, httpx.TransportError) or outcome.status_code == 503
        if not (moves and servers.moves_on(method, outcome, keyed=keyed)) or now() > until:
            return outcome
        servers.move(outcome)
        tries += 1
        await sleep(servers.pause(tries))  # failover backoff


def send_sync(
    servers: Servers,
    pool: Callable[[], httpx.Client],
    method: str,
    path: str,
    *,
    default: float,
    own: float | None = None,
    keyed: bool = False,
    **kwargs: Any,
) -> httpx.Response | httpx.TransportError:
    """``send`` for a blocking client (the sync ``Client``, off any event loop)."""
    until = time.monotonic() + servers.failover_for
    tries = 0
    while True:
        timeout = servers.timeout(method, tries, default=default, own=own, keyed=keyed)
        outcome: httpx.Response | httpx.TransportError
        try:
            outcome = pool().request(method, path, timeout=timeout, **kwargs)
        except httpx.TransportError as exc:
            outcome = exc
        moves = isinstance(outcome, httpx.TransportError) or outcome.status_code == 503
        if not (moves and servers.moves_on(method, outcome, keyed=keyed)) or (
            time.monotonic() > until
        ):
            return outcome
        servers.move(outcome)
        tries += 1
        time.sleep(servers.pause(tries))  # failover backoff


def _code(resp: httpx.Response) -> str:
    """The error code of an answer; a body-less answer (HEAD) of a standby is ``not_leader``."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("code"):
        return str(body["code"])
    if resp.status_code == 503 and resp.headers.get(ROLE_HEADER) == "standby":
        return "not_leader"
    return ""


def _leader(resp: httpx.Response) -> str | None:
    try:
        leader = resp.json().get("details", {}).get("leader")
    except (ValueError, AttributeError):
        leader = None
    leader = leader or resp.headers.get(LEADER_HEADER)  # a HEAD answer has only its headers
    return str(leader) if leader else None
