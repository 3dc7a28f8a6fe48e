"""The event log: job, worker and session changes for UIs, in a ring, followed with a cursor.

A cursor is ``"<epoch>:<seq>"``. The epoch is new random hex each time a control plane starts, so a
cursor kept across a restart (where numbering starts again) is recognised as such and answered
with ``reset=True``: the client refetches its lists and follows on from the page's cursor. The
same happens when the events after a cursor have already left the ring. ``next_since`` (the bare
sequence number) is still filled for clients that predate cursors.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Event, EventPage, Job, SessionInfo, WorkerInfo
from ..errors import InvalidInput
from .signals import Signal

MAX_EVENTS = 10_000


class EventLog:
    """A bounded, numbered ring of events with a long-poll and an epoch."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, maxlen: int = MAX_EVENTS) -> None:
        self.clock = clock
        self.epoch = secrets.token_hex(4)
        self.seq = 0
        self._ring: deque[Event] = deque(maxlen=maxlen)
        self._signal = Signal(clock)
        # Until the control plane starts (and after it stops) a long-poll answers at once.
        self.open = False

    def job(self, job: Job) -> None:
        self._emit(Event(seq=self.seq + 1, time=self.clock.now(), kind="job", job=job))

    def worker(self, worker: WorkerInfo) -> None:
        self._emit(Event(seq=self.seq + 1, time=self.clock.now(), kind="worker", worker=worker))

    def session(self, session: SessionInfo) -> None:
        self._emit(Event(seq=self.seq + 1, time=self.clock.now(), kind="session", session=session))

    def _emit(self, event: Event) -> None:
        self.seq = event.seq
        self._ring.append(event)
        self._signal.fire()

    def cursor(self) -> str:
        """Where the log stands now: follow from here to see only what happens next."""
        return f"{self.epoch}:{self.seq}"

    def close(self) -> None:
        self.open = False
        self._signal.fire()

    async def page(
        self,
        since: int = 0,
        wait: float = 0.0,
        cursor: str | None = None,
        visible: Callable[[Event], bool] | None = None,
    ) -> EventPage:
        """Events after ``cursor`` (or ``since``); with ``wait`` > 0, long-poll until one exists.

        ``visible`` keeps only the events a caller may see (a user: its own jobs'); the
        long-poll waits on for one of those."""
        if cursor:
            epoch, since = _parse(cursor)
            if epoch != self.epoch:
                return self._page([], reset=True)
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            oldest = self._ring[0].seq if self._ring else self.seq + 1
            # Reset: the events after `since` are gone (dropped from the ring), or `since` is from
            # before a restart (numbers start again): the client refetches its lists.
            reset = (since < oldest - 1 and since != 0 and bool(self._ring)) or since > self.seq
            events = [e for e in self._ring if e.seq > since] if self.seq > since else []
            if visible is not None:
                events = [e for e in events if visible(e)]
            left = deadline - self.clock.monotonic()
            if events or reset or left <= 0 or not self.open:
                return self._page(events, reset=reset)
            await self._signal.wait(left)

    def _page(self, events: list[Event], *, reset: bool) -> EventPage:
        return EventPage(events=events, next_since=self.seq, reset=reset, cursor=self.cursor())


def _parse(cursor: str) -> tuple[str, int]:
    epoch, sep, seq = cursor.partition(":")
    if not sep or not epoch or not seq.isdigit():
        raise InvalidInput(
            f"event cursor {cursor!r} is not <epoch>:<seq>",
            hint="pass the `cursor` of the last event page, or ask for the current one",
            details={"field": "cursor", "value": cursor},
        )
    return epoch, int(seq)
