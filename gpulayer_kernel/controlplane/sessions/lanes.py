"""A GPU kernel's message lanes on the control plane (ADR 0021), bounded in bytes (issue 33).

A :class:`Lane` is one direction's messages (*down*: the Jupyter host's to the kernel; *up*: the
kernel's to the host), numbered as they are put, kept until their reader acknowledges them
(``ack``): a message lost on the wire, or in a reader's reconnect, is sent again.

What a lane holds is bounded three ways, so no caller can grow the server's memory:

- a lane holds at most ``limit`` bytes unread (``LANE_BYTES``; ``WAITING_BYTES`` for the host's
  messages while the kernel is not up yet), except that one larger message passes when the lane
  is empty (up to ``MAX_MESSAGE``: a big widget message still travels, alone);
- every lane of the control plane together holds at most ``RELAY_BYTES`` (:class:`Budget`);
- the up lane sheds its oldest iopub messages to make room, as a ZMQ PUB socket drops for a
  subscriber that does not keep up (replies are never shed: a client waits for them).

A put that does not fit raises ``Busy`` (429: send again once it drained); a stream's writer
awaits ``room`` instead, which holds its socket unread (TCP pushes back). ``clear`` frees a lane
when its kernel ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ...clock import Clock
from ...contracts.kernels import LANE_BYTES, MAX_MESSAGE, RELAY_BYTES
from ...display import human_bytes
from ...errors import Busy, TooLarge
from ...wire.kernels import KernelMessage
from ..signals import Signal
from ..trim import freed as trim_freed


class Budget:
    """The bytes every lane of one relay holds together."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = RELAY_BYTES) -> None:
        self.limit = limit
        self.used = 0


class Lane:
    """One direction's messages of one kernel, numbered, kept until acknowledged."""

    __slots__ = (
        "applied",
        "budget",
        "drained",
        "dropped",
        "items",
        "limit",
        "seq",
        "signal",
        "size",
        "writer",
    )

    def __init__(self, clock: Clock, budget: Budget, seq: int, limit: int = LANE_BYTES) -> None:
        self.signal = Signal(clock)  # fired by a put: a reader waits on it
        self.drained = Signal(clock)  # fired by an ack or a clear: a writer waits on it
        self.budget = budget
        self.limit = limit
        self.items: deque[tuple[int, KernelMessage]] = deque()
        self.seq = seq
        self.size = 0
        self.dropped = 0  # iopub messages dropped for room, all told
        self.writer = ""  # the stream writer whose numbering ``applied`` counts
        self.applied = 0  # the last of that writer's messages put here

    def room_for(self, n: int) -> bool:
        """Whether ``n`` more bytes fit now (an empty lane takes up to ``MAX_MESSAGE``)."""
        lane_ok = self.size + n <= self.limit or (not self.items and n <= MAX_MESSAGE)
        return lane_ok and self.budget.used + n <= self.budget.limit

    def check(self, m: KernelMessage, what: str, *, most: int = MAX_MESSAGE) -> None:
        """Refuse a message that could never fit (413), whatever drains: over ``most`` bytes
        (``MAX_MESSAGE``; the small buffer of a kernel that is not up yet)."""
        if m.size > most:
            header = m.header() or {}
            raise TooLarge(
                f"a {human_bytes(m.size)} {m.channel} message "
                f"({header.get('msg_type', 'unknown type')}) is over the "
                f"{human_bytes(most)} {what} takes",
                hint="send less at once (smaller widget values, files through the workspace)"
                if most == MAX_MESSAGE
                else "wait until the kernel is up (its session is still queued or starting)",
                details={"size": m.size, "limit": most},
                code="kernel_message_too_large",
            )

    def put(self, messages: Iterable[KernelMessage], *, shed_iopub: bool = False) -> None:
        """Add messages, all or none; ``Busy`` when they do not fit (``shed_iopub``: the oldest
        iopub messages give way first)."""
        batch = list(messages)
        need = sum(m.size for m in batch)
        if shed_iopub and not self.room_for(need):
            self.shed(need)
        if batch and not self.room_for(need):
            raise Busy(
                f"the kernel's message lane is full ({human_bytes(self.size)} unread)",
                hint="send again once the other side has read its messages",
                details={"held": self.size, "limit": self.limit, "retry_after": 1},
                code="kernel_lane_full",
            )
        for m in batch:
            self.seq += 1
            self.items.append((self.seq, m))
        self.size += need
        self.budget.used += need
        if batch:
            self.signal.fire()

    async def room(self, n: int, timeout: float) -> bool:
        """Wait until a message of ``n`` bytes fits; False when ``timeout`` passed first."""
        while not self.room_for(n):
            if not await self.drained.wait(timeout):
                return self.room_for(n)
        return True

    def after(self, since: int) -> list[tuple[int, KernelMessage]]:
        """The messages numbered after ``since``, kept (``ack`` drops them)."""
        return [(seq, m) for seq, m in self.items if seq > since]

    def ack(self, since: int) -> None:
        """The reader has everything up to ``since``: drop it."""
        freed = 0
        while self.items and self.items[0][0] <= since:
            freed += self.items.popleft()[1].size
        self._freed(freed)

    def clear(self) -> None:
        """Drop everything (the kernel ended, or its host restarted it)."""
        self._freed(self.size)
        self.items.clear()

    def shed(self, need: int) -> None:
        """Drop the oldest iopub messages until ``need`` bytes fit (or none is left to drop)."""
        kept: deque[tuple[int, KernelMessage]] = deque()
        freed = 0
        for item in self.items:
            if item[1].channel == "iopub" and not self.room_for(need):
                freed += item[1].size
                self.dropped += 1
                self.size -= item[1].size
                self.budget.used -= item[1].size
                continue
            kept.append(item)
        self.items = kept
        if freed:
            trim_freed(freed)

    def _freed(self, n: int) -> None:
        if n:
            self.size -= n
            self.budget.used -= n
            self.drained.fire()
            trim_freed(n)
