"""The frames between a session's executor and its rank processes (ADR 0019): a 4-byte
big-endian length, then one JSON object. The rank side is synchronous (a socket and a sender
thread: ``host.py``), the worker side asyncio (``executor.py``); both read and write
through here. Stdlib only: a rank process imports this before anything else.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

MAX_FRAME = 256 << 20  # one frame: a cell's source, or a cell's last output items
LEN = struct.Struct(">I")


def encode_frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":"), default=str).encode()
    return LEN.pack(len(data)) + data


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode_frame(message))


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame, or None at EOF."""
    head = _recv_exact(sock, LEN.size)
    if head is None:
        return None
    (n,) = LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the limit")
    body = _recv_exact(sock, n)
    if body is None:
        return None
    message: dict[str, Any] = json.loads(body)
    return message


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame from a rank, or None at EOF (a rank that died, or one over the limit:
    the executor then treats the rank as gone)."""
    try:
        head = await reader.readexactly(LEN.size)
        (n,) = LEN.unpack(head)
        if n > MAX_FRAME:
            return None
        body = await reader.readexactly(n)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    frame: dict[str, Any] = json.loads(body)
    return frame


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
