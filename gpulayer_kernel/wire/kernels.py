"""A GPU kernel's messages on the wire (ADR 0021): raw ZMQ multipart messages, in binary.

A :class:`KernelMessage` is one multipart message of a kernel channel as the ZMQ socket gave it
(the Jupyter client's routing identities, the delimiter, the signature, the header and the rest):
the relay neither reads nor signs it. On a stream (``wire/stream.py``) each message is one
binary WebSocket message::

    b"M" seq:u64 channel:u8 nparts:u16 (len:u32 part)*   a kernel message, numbered by its sender
    b"A" seq:u64                                         everything up to seq was taken
    b"S" json                                            the server's word: the kernel's state,
                                                         what it took of this writer, a refusal

Over the HTTP routes (the fallback where a proxy refuses WebSockets) the same message is a
``KernelFrame`` contract with its parts in base64: :func:`to_frames` and :func:`from_frames`.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts.kernels import Channel, KernelFrame, KernelState

CHANNELS: tuple[Channel, ...] = ("shell", "control", "stdin", "iopub")
_CHANNEL_ID = {c: i for i, c in enumerate(CHANNELS)}
DELIM = b"<IDS|MSG>"

MSG, ACK, STATE = b"M", b"A", b"S"
_HEAD = struct.Struct("!QBH")  # seq, channel, parts
_LEN = struct.Struct("!I")
_SEQ = struct.Struct("!Q")


class KernelMessage:
    """One multipart message of a kernel channel (a plain struct: it is on every cell's path)."""

    __slots__ = ("channel", "parts", "size")

    def __init__(self, channel: Channel, parts: Sequence[bytes]) -> None:
        self.channel = channel
        self.parts = list(parts)
        self.size = sum(len(p) for p in self.parts)

    def header(self) -> dict[str, Any] | None:
        """The message's header (JSON after the signature), or None when it has none."""
        return part(self.parts, 2)

    def parent(self) -> dict[str, Any] | None:
        return part(self.parts, 3)

    def idents(self) -> list[bytes]:
        """The routing identities in front of the delimiter."""
        try:
            return self.parts[: self.parts.index(DELIM)]
        except ValueError:
            return []

    def __repr__(self) -> str:
        h = self.header() or {}
        return f"<KernelMessage {self.channel} {h.get('msg_type', '?')} {self.size} bytes>"


def part(parts: Sequence[bytes], offset: int) -> dict[str, Any] | None:
    """The JSON object ``offset`` frames after the delimiter (2: header, 3: parent, 5: content)."""
    try:
        value = json.loads(parts[list(parts).index(DELIM) + offset])
    except (ValueError, IndexError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def encode(seq: int, m: KernelMessage) -> bytes:
    """One stream message carrying ``m`` as the sender's message number ``seq``."""
    out = [MSG, _HEAD.pack(seq, _CHANNEL_ID[m.channel], len(m.parts))]
    for p in m.parts:
        out.append(_LEN.pack(len(p)))
        out.append(p)
    return b"".join(out)


def decode(data: bytes) -> tuple[int, KernelMessage]:
    """(seq, message) of a ``b"M"`` stream message; ValueError when it is not one."""
    if data[:1] != MSG:
        raise ValueError("not a kernel message")
    try:
        seq, channel, n = _HEAD.unpack_from(data, 1)
        at = 1 + _HEAD.size
        parts = []
        for _ in range(n):
            (length,) = _LEN.unpack_from(data, at)
            at += _LEN.size
            if at + length > len(data):
                raise ValueError("a part runs past the message")
            parts.append(data[at : at + length])
            at += length
        if at != len(data):
            raise ValueError("bytes after the last part")
        return seq, KernelMessage(CHANNELS[channel], parts)
    except (struct.error, IndexError) as exc:
        raise ValueError(f"a malformed kernel message: {exc}") from None


def encode_ack(seq: int) -> bytes:
    return ACK + _SEQ.pack(seq)


def decode_ack(data: bytes) -> int:
    if data[:1] != ACK or len(data) != 1 + _SEQ.size:
        raise ValueError("not an acknowledgement")
    return int(_SEQ.unpack_from(data, 1)[0])


def encode_state(state: dict[str, Any]) -> bytes:
    return STATE + json.dumps(state, separators=(",", ":")).encode()


def decode_state(data: bytes) -> dict[str, Any]:
    value = json.loads(data[1:])
    if not isinstance(value, dict):
        raise ValueError("a state message is a JSON object")
    return value


def to_frames(messages: Iterable[KernelMessage]) -> list[KernelFrame]:
    """The messages as the HTTP routes' contract (parts in base64)."""
    return [
        KernelFrame.model_construct(
            channel=m.channel, parts=[base64.b64encode(p).decode() for p in m.parts]
        )
        for m in messages
    ]


def frames_body(messages: Iterable[KernelMessage]) -> str:
    """The JSON body of a ``frames`` POST (``KernelFrames``) carrying ``messages``."""
    from ..contracts.kernels import KernelFrames

    return KernelFrames.model_construct(frames=to_frames(messages)).model_dump_json()


def from_frames(frames: Iterable[KernelFrame]) -> list[KernelMessage]:
    """The HTTP routes' frames as messages; ValueError names a part that is not base64."""
    out = []
    for i, f in enumerate(frames):
        try:
            parts = [base64.b64decode(p, validate=True) for p in f.parts]
        except ValueError:
            raise ValueError(f"frame {i}: a part is not valid base64") from None
        out.append(KernelMessage(f.channel, parts))
    return out


@dataclass
class KernelStatus:
    """Where a kernel is, as its Jupyter host is told: ``state``, the process's ``generation``,
    why it waits, exited or ended, and whether an end is ``final`` (its session was ended on
    purpose: stopped or idled out; nothing restarts it until the user asks)."""

    state: KernelState
    generation: int
    reason: str | None = None
    final: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "generation": self.generation,
            "reason": self.reason,
            "final": self.final,
        }


@dataclass
class LanePage:
    """What one read of a lane gives: messages after the reader's cursor, where to go on from
    (which acknowledges the rest), and the kernel's status."""

    messages: list[KernelMessage]
    next_since: int
    status: KernelStatus
