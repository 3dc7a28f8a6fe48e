"""Long-polls at the HTTP edge: a ControlPlane wait raced against the client leaving and the server
stopping, and counted so a stopping server can let its 503s go out before it closes connections.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import tornado.web

from ..errors import Unavailable
from .context import ApiContext

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed its connection during a long-poll: nothing to answer."""


def shutting_down() -> Unavailable:
    return Unavailable(
        "the server is shutting down",
        hint="retry in a moment (clients and workers do this on their own)",
        code="shutting_down",
    )


class LongPollMixin(tornado.web.RequestHandler):
    """``long_poll(wait, call)`` for a handler; ``GLMixin`` brings it to every route."""

    ctx: ApiContext

    def initialize(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self._gl_closed = asyncio.Event()
        self._gl_polling = False

    def on_finish(self) -> None:
        if self._gl_polling:
            self._gl_polling = False
            self.ctx.polls -= 1
            if self.ctx.polls == 0:
                self.ctx.polls_done.set()
        super().on_finish()

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self._gl_closed.set()

    @property
    def client_gone(self) -> bool:
        return self._gl_closed.is_set()

    async def long_poll(self, wait: float, call: Awaitable[T]) -> T:
        """Await a ControlPlane long-poll, giving up when the client leaves or the server stops.

        The loop is never blocked: the wait is the ControlPlane's condition, raced against the
        connection's close and the server's stop.
        """
        if wait <= 0:
            return await call
        ctx = self.ctx
        if ctx.stopping.is_set():
            _close_awaitable(call)
            raise shutting_down()
        task = asyncio.ensure_future(call)
        # A keyed write (ADR 0003) runs to its answer even when its client left: the client's
        # retry waits for that answer, which is stored; giving up would leave its outcome unknown.
        closed = asyncio.Event() if getattr(self, "gl_keyed", False) else self._gl_closed
        gone = asyncio.ensure_future(closed.wait())
        stop = asyncio.ensure_future(ctx.stopping.wait())
        if not self._gl_polling:
            # Counted until the answer is written (on_finish), so a stopping server's drain()
            # waits for the 503 to go out before it closes connections.
            self._gl_polling = True
            ctx.polls += 1
        try:
            await asyncio.wait({task, gone, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._gl_closed.is_set():
            raise ClientGone()
        raise shutting_down()


def _close_awaitable(call: Awaitable[Any]) -> None:
    """Close a coroutine that will never be awaited (no "never awaited" warning)."""
    close = getattr(call, "close", None)
    if close is not None:
        close()
