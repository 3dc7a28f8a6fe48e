"""Shipping log lines from a job to the control plane: batched, redacted, never late.

A line is sent at once when no send is in flight; lines that arrive while one is in flight are
batched into the next send (a Nagle without the delay). So a quiet job's line arrives in one round
trip, and a chatty job's lines go out in few, large batches. A failed send is retried after a
backoff that starts at ``flush_interval`` and doubles (capped at :data:`MAX_BACKOFF`); every wait,
and every line's timestamp, comes from the shipper's :class:`~gpulayer_kernel.clock.Clock`.

With ``queue`` (a one-shot job's lines, handed to the worker's reporter: ``worker/reports.py``)
each line is queued there at once instead: the reporter batches, orders and retries them with the
rest of the attempt's reports, and ``close`` has nothing left to wait for.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from .. import display
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import LogLine
from ..errors import Conflict, NotFound
from ..redact import Redactor

log = logging.getLogger("gpulayer.worker")

MAX_BATCH = 2_000
Stream = Literal["stdout", "stderr", "system"]
# Tags a pipe's line with its rank; None holds the line back (a launcher's own noise).
SplitRank = Callable[[str], "tuple[int | None, str] | None"]
MAX_LINE = 64 * 1024  # characters of one line before it is shipped in pieces
SEND_TIMEOUT = 30.0  # seconds one send may take before it counts as failed
ATTEMPTS = 5  # sends of one batch before its lines are dropped
MAX_BACKOFF = 2.0  # seconds, at most, between two attempts


class LogShipper:
    """One job's lines on their way to the control plane: ``add`` never waits, ``close`` flushes."""

    def __init__(
        self,
        send: Callable[[list[LogLine]], Awaitable[None]],
        redactor: Redactor,
        flush_interval: float = 0.1,
        *,
        clock: Clock = SYSTEM_CLOCK,
        queue: Callable[[list[LogLine]], None] | None = None,
    ) -> None:
        self._send = send
        self._queue = queue
        self._clock = clock
        self.redactor = redactor
        self._redact = redactor.redact
        self._buf: list[LogLine] = []
        self._task: asyncio.Task[None] | None = None
        self._flush_interval = flush_interval
        self.sent = 0
        self.dropped = 0

    def add(
        self, stream: Stream, text: str, rank: int | None = None, cell: int | None = None
    ) -> None:
        self.add_line(self.line(stream, text, rank, cell))

    def line(
        self,
        stream: Stream | Literal["display"],
        text: str,
        rank: int | None = None,
        cell: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> LogLine:
        """A line as it goes out: redacted (a display's text entries too) and stamped now."""
        if data is not None:
            data = display.redact(data, self._redact)
        return LogLine.model_construct(
            time=self._clock.now(),
            stream=stream,
            rank=rank,
            text=self._redact(text),
            cell=cell,
            data=data,
        )

    def add_line(self, line: LogLine) -> None:
        """Queue a line made by :meth:`line`; it goes out at once unless a send is in flight."""
        if self._queue is not None:
            self._queue([line])
            self.sent += 1
            return
        self._buf.append(line)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._pump())

    async def settle(self) -> list[LogLine]:
        """Wait for the send in flight, then take (and no longer send) what is still queued:
        a session cell's last lines travel in its report instead, after all earlier ones."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
        lines, self._buf = self._buf, []
        return lines

    async def _pump(self) -> None:
        while self._buf:
            batch, self._buf = self._buf[:MAX_BATCH], self._buf[MAX_BATCH:]
            for attempt in range(ATTEMPTS):
                try:
                    await self._send_within(batch, SEND_TIMEOUT)
                    self.sent += len(batch)
                    break
                except (Conflict, NotFound):
                    # The control plane no longer takes lines for this job (it ended, or its
                    # gang failed elsewhere): retrying cannot succeed.
                    self.dropped += len(batch)
                    break
                except Exception as exc:
                    log.warning("sending %d log lines failed (%s); retrying", len(batch), exc)
                    await self._clock.sleep(min(MAX_BACKOFF, self._flush_interval * 2**attempt))
            else:
                self.dropped += len(batch)

    async def _send_within(self, batch: list[LogLine], timeout: float) -> None:
        sending = asyncio.ensure_future(self._send(batch))
        try:
            if not await self._clock.wait_for(sending, timeout):
                raise TimeoutError(f"no answer within {timeout:g}s")
            sending.result()
        finally:
            sending.cancel()

    async def close(self) -> None:
        """Send everything buffered; returns once the control plane has it."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await self._task
        if self._buf:
            await self._pump()


class LineSink(Protocol):
    """Where a pipe's lines go: a :class:`LogShipper`, or a view of one (a session's rank)."""

    redactor: Redactor

    def add(self, stream: Stream, text: str, rank: int | None = None) -> None: ...


async def pump_stream(
    reader: asyncio.StreamReader,
    stream: Stream,
    shipper: LineSink,
    split_rank: SplitRank | None = None,
) -> None:
    """Read a pipe to EOF and hand each complete line (without the newline) to the shipper.

    A line longer than :data:`MAX_LINE` characters goes out in pieces, cut where no secret
    straddles the cut (``Redactor.cut``), so each piece is redacted as safely as a whole line.
    Bytes are decoded incrementally: a character split between two reads stays whole.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    redactor = shipper.redactor
    partial = ""
    emit = _Emitter(stream, shipper, split_rank)
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        partial += decoder.decode(chunk)
        *lines, partial = partial.split("\n")
        for text in lines:
            emit(text, last=True)
        # A line without end: ship it in pieces, holding back what a secret could straddle.
        while len(partial) >= MAX_LINE + redactor.window:
            n = redactor.cut(partial, MAX_LINE)
            emit(redactor.redact(partial[:n]), last=False)
            partial = partial[n:]
    partial += decoder.decode(b"", final=True)
    if partial:
        emit(partial, last=True)


class _Emitter:
    """Hands lines to the shipper; the pieces of one long line share its first piece's rank."""

    def __init__(self, stream: Stream, shipper: LineSink, split_rank: SplitRank | None) -> None:
        self.stream = stream
        self.shipper = shipper
        self.split_rank = split_rank
        self._piece_of: tuple[int | None, str] | None = None  # the line being continued

    def __call__(self, text: str, last: bool) -> None:
        text = text.rstrip("\r") if last else text
        tagged: tuple[int | None, str] | None = (None, text)
        if self._piece_of is not None:  # a continuation: same rank, and no prefix to parse
            tagged = (self._piece_of[0], text) if self._piece_of[1] == "ship" else None
        elif self.split_rank is not None:
            tagged = self.split_rank(text)
        if not last:
            self._piece_of = (tagged[0] if tagged else None, "ship" if tagged else "hold")
        else:
            self._piece_of = None
        if tagged is not None:
            self.shipper.add(self.stream, tagged[1], tagged[0])
