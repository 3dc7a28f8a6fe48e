"""The worker tunnel's messages (``api/tunnel.py`` serves it, ``wire/tunnel.py`` is the worker's
end): one request or one answer each.

A message is ``<4-byte big-endian header length><header as JSON><body>``. A request's header is
``{"i": n, "m": "POST", "u": "/api/v1/worker/reports?...", "h": {headers}}``, its answer's
``{"i": n, "s": status, "h": {headers}}``: ``i`` pairs them (answers come in any order). A
request its sender no longer waits for is said so with ``{"i": n, "x": true}`` (no answer comes).
"""

from __future__ import annotations

import json
import struct
from typing import Any

_LEN = struct.Struct(">I")
HEADROOM = 64 << 10  # bytes of a message beyond its body: the header and its headers
# The answer to a request the tunnel does not take (RFC 9110's "misdirected request": send it
# on another connection): the worker's end sends it again over HTTP.
MISDIRECTED = 421


def pack(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One message: its header's length, the header as JSON, the body."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(head)) + head + body


def unpack(message: bytes) -> tuple[dict[str, Any], bytes]:
    """A message's header and body; ``ValueError`` for one that is not a tunnel message."""
    if len(message) < _LEN.size:
        raise ValueError("a tunnel message shorter than its length field")
    (n,) = _LEN.unpack_from(message)
    if n > len(message) - _LEN.size:
        raise ValueError("a tunnel message shorter than its header")
    header = json.loads(message[_LEN.size : _LEN.size + n])
    if not isinstance(header, dict):
        raise ValueError("a tunnel message whose header is not an object")
    return header, message[_LEN.size + n :]
