"""Which protocol the two ends of ``/api/v1`` speak, and how a mismatch is refused (ADR 0003).

Every request and every answer of a GPUlayer peer carries ``GPUlayer-Protocol: 1.1``. A peer
without the header speaks 1.0 (it predates the header): it is answered exactly as before, and
never sent anything 1.1 added. A minor version is only ever added to: each end speaks the lower
of the two. Another major version is refused at once, naming both versions, by the server (400
``protocol_unsupported``) and by a client or worker reading the server's answer.
"""

from __future__ import annotations

import re

from .contracts import PROTOCOL
from .errors import InvalidInput

HEADER = "GPUlayer-Protocol"
Version = tuple[int, int]
OLDEST: Version = (1, 0)  # what a peer without the header speaks
_VERSION = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})")


def ours() -> Version:
    return parse(PROTOCOL)


def parse(value: str) -> Version:
    match = _VERSION.fullmatch(value.strip())
    if match is None:
        raise InvalidInput(
            f"{HEADER}: {value!r} is not a protocol version (major.minor, such as {PROTOCOL})",
            hint="send the version this client or worker speaks, or leave the header out",
            details={"header": HEADER, "value": value},
            code="protocol_unsupported",
        )
    return int(match.group(1)), int(match.group(2))


def peer(value: str | None, *, peer_is: str) -> Version:
    """The version a peer says it speaks (``None``: 1.0), or the refusal naming both.

    ``peer_is``: what the peer is, for the message ("the client", "the server at …").
    """
    if value is None:
        return OLDEST
    theirs, mine = parse(value), ours()
    if theirs[0] != mine[0]:
        raise InvalidInput(
            f"{peer_is} speaks GPUlayer protocol {theirs[0]}.{theirs[1]}; this side speaks "
            f"{PROTOCOL}, and the major versions differ",
            hint="install the same major version of GPUlayer on both sides "
            "(pip install -U gpulayer)",
            details={"theirs": f"{theirs[0]}.{theirs[1]}", "ours": PROTOCOL},
            code="protocol_unsupported",
        )
    return theirs


def at_least(version: Version, minor: int) -> bool:
    return version[0] == ours()[0] and version[1] >= minor
