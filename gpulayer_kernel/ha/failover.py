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
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from ..errors import InvalidInput

# The codes a server answers with when another server should take the request.
MOVE_CODES = frozenset({"not_leader", "shutting_down", "starting"})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
DEFAULT_FAILOVER_FOR = 30.0


def split_urls(urls: str | Sequence[str]) -> list[str]:
    out = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u.strip()]
    if not out:
        raise InvalidInput("no server URL given", hint="pass --server URL or set GPULAYER_URL")
    return out


def _same(a: str, b: str) -> bool:
    return a.rstrip("/").removesuffix("/api/v1") == b.rstrip("/").removesuffix("/api/v1")


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

    def move(self, outcome: BaseException | httpx.Response | None = None) -> None:
        """To the leader the answer named, if it is one of ours, else to the next URL."""
        leader = _leader(outcome) if isinstance(outcome, httpx.Response) else None
        for i, url in enumerate(self.urls):
            if leader and _same(url, leader) and i != self.current:
                self.current = i
                return
        self.current = (self.current + 1) % len(self.urls)

    def pause(self, tries: int) -> float:
        """Seconds to wait before try number ``tries`` (0 within the first round)."""
        rounds = tries // len(self.urls)
        return 0.0 if tries % len(self.urls) else min(2.0, 0.1 * 2**rounds) if rounds else 0.0

    def deadline(self) -> float:
        return time.monotonic() + self.failover_for


def _code(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return ""
    return str(body.get("code", "")) if isinstance(body, dict) else ""


def _leader(resp: httpx.Response) -> str | None:
    try:
        leader = resp.json().get("details", {}).get("leader")
    except (ValueError, AttributeError):
        return None
    return str(leader) if leader else None
