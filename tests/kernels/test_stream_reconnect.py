"""A kernel stream sends again, in order, what the server did not acknowledge before a reconnect,
even when a new message comes while it reconnects (found by the served-plane outage test, issue
33: after ``gpulayer serve`` came back, a cell's later output was written before its earlier,
unacknowledged output, and the server dropped the earlier as taken already).

A real WebSocket server (tornado, as ``gpulayer serve``'s) scripted for the case: it closes the
first connection on the first message, without acknowledging it, and says its state on the
second only after a pause, during which the client sends a new message.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import tornado.httpserver
import tornado.web
import tornado.websocket

from gpulayer_kernel.testing import until
from gpulayer_kernel.wire.kernels import MSG, KernelMessage, decode, encode_state
from gpulayer_kernel.wire.stream import Stream


class Scripted(tornado.websocket.WebSocketHandler):
    """Records, per connection, the message numbers it receives."""

    def initialize(self, record: list[list[int]]) -> None:
        self.record = record
        self.index = -1

    async def open(self, *args: Any, **kwargs: Any) -> None:
        self.index = len(self.record)
        self.record.append([])
        if self.index == 1:
            await asyncio.sleep(0.5)  # the reconnect's handshake is slow: the client sends
        state = {"applied": 0, "state": "up", "generation": 0, "reason": None}
        await self.write_message(encode_state(state), binary=True)

    def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes) and message[:1] == MSG:
            seq, _ = decode(message)
            self.record[self.index].append(seq)
            if self.index == 0:
                self.close()  # gone before it acknowledged anything


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_what_was_not_acknowledged_goes_first_after_a_reconnect() -> None:
    record: list[list[int]] = []
    app = tornado.web.Application([(r"/api/v1/k/stream", Scripted, {"record": record})])
    port = free_port()
    server = tornado.httpserver.HTTPServer(app)
    server.listen(port, "127.0.0.1")
    stream = Stream(f"http://127.0.0.1:{port}", "/k/stream", "token")
    try:
        await stream.send([KernelMessage("iopub", [b"tick 1"])])
        await until(lambda: len(record) == 2, 10)  # reconnecting, state not said
        await stream.send([KernelMessage("iopub", [b"tick 2"])])
        await until(lambda: len(record[1]) >= 2, 10)
        assert record[0] == [1]
        assert record[1] == [1, 2]  # in order: 2 first, and the server would drop 1
    finally:
        await stream.close()
        server.stop()
