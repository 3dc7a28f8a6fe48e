"""What every handler of one mounted API shares: the ControlPlane, tokens, limits, the route table.

One ``ApiContext`` per mount (``gpulayer serve``, or inside a Jupyter server); ``drain()`` ends
its long-polls when the host stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from ..contracts import PROTOCOL
from ..controlplane import ControlPlane
from ..security import TokenService
from .idempotency import Keys
from .ops import Operation
from .params import ApiLimits


def package_version() -> str:
    """The gpulayer version (what ``/status``, ``/health`` and ``openapi.json`` report)."""
    from .. import __version__

    return __version__


@dataclass
class ApiContext:
    """What every handler needs; one per mounted API (standalone or inside Jupyter)."""

    cp: ControlPlane
    tokens: TokenService
    limits: ApiLimits = field(default_factory=ApiLimits)
    version: str = ""
    heartbeat_interval: float | None = None
    # The mounted route table, which openapi.json describes (set by ``routes.make_context``).
    operations: tuple[Operation, ...] = ()
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    polls: int = 0
    polls_done: asyncio.Event = field(default_factory=asyncio.Event)
    requests: int = 0  # requests between their prepare and their finish (``drain`` waits)
    requests_done: asyncio.Event = field(default_factory=asyncio.Event)
    uploads: int = 0  # raw bodies streaming to disk now (``ApiLimits.max_uploads`` at most)
    # The protocol this mount speaks: "1.0" serves exactly the routes and answers of a server
    # from before 1.1 (to test that new clients and workers still speak to one).
    protocol: str = PROTOCOL
    keys: Keys = field(default_factory=Keys)  # keyed writes in flight (ADR 0003)
    streams: set[Any] = field(default_factory=set)  # open WebSocket streams (``streams.py``)

    async def drain(self, timeout: float = 1.0) -> None:
        """Stop: every long-poll answers now (503 shutting_down); wait briefly for them and for
        every other request in flight, so that a request whose work was done gets its answer
        (a worker told nothing would send its report again: its log lines twice)."""
        self.stopping.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.polls:
            self.polls_done.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.polls_done.wait(), timeout)
        if self.requests:
            self.requests_done.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.requests_done.wait(), max(0.0, deadline - loop.time()))
        if self.keys.writing:  # follow routes' statuses, written as their answers went
            await asyncio.wait(self.keys.writing, timeout=max(0.0, deadline - loop.time()))
