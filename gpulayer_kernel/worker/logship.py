"""Shipping log lines from a job to the control plane: batched, redacted, never late.

A line is sent at once when no send is in flight; lines that arrive while one is in flight are
batched into the next send (a Nagle without the delay). So a quiet job's line arrives in one round
trip, and a chatty job's lines go out in few, large batches. A failed send is retried after a
backoff that starts at ``flush_interval`` and doubles (capped at :data:`MAX_BACKOFF`); every wait,
and every line's timestamp, comes from the shipper's :class:`~gpulayer_kernel.clock.Clock`.

With ``queue`` (a one-shot job's lines, handed to the worker's reporter: ``worker/reports.py``)
the lines of each event-loop turn are queued there together instead: the reporter batches,
orders and retries them with the rest of the attempt's reports, and ``close`` has nothing left
to wait for.

Volume (``contracts/limits.py``): a line over ``LINE_PIECE`` characters goes out in pieces; a
job's log keeps ``JOB_LOG_CAP`` bytes and a session cell's output ``CELL_OUTPUT_CAP`` bytes
(``CELL_OUTPUT_LINES`` lines), past which lines are dropped and counted, and :meth:`note` makes
the one line that says so. Memory stays bounded: while more than ``BACKLOG_LINES`` lines (or
``BACKLOG_BYTES``) wait for the control plane, :func:`pump_stream` stops reading the job's pipe,
so the job's own writes wait instead of the worker's memory growing.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .. import display
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import LogLine
from ..contracts.limits import (
    BACKLOG_BYTES,
    BACKLOG_LINES,
    CELL_OUTPUT_CAP,
    CELL_OUTPUT_LINES,
    JOB_LOG_CAP,
    LINE_PIECE,
    dropped_note,
)
from ..errors import Conflict, NotFound
from ..redact import Redactor
from .fitting import make_line, pieces, utf8_len

log = logging.getLogger("gpulayer.worker")

MAX_BATCH = 2_000
Stream = Literal["stdout", "stderr", "system"]
# Tags a pipe's line with its rank; None holds the line back (a launcher's own noise).
SplitRank = Callable[[str], "tuple[int | None, str] | None"]
MAX_LINE = LINE_PIECE  # characters of one line before it is shipped in pieces
Queue = Callable[[list[LogLine]], "asyncio.Future[None] | None"]


@dataclass
class Kept:
    """What one log (a job's, or a cell's output) has kept so far, and dropped past its cap."""

    size: int = 0
    lines: int = 0
    dropped_lines: int = 0
    dropped_size: int = 0
    open: bool = False  # the last dropped piece did not end its line (its next piece: no count)


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
        queue: Queue | None = None,
        cap: int = JOB_LOG_CAP,
    ) -> None:
        """``cap``: bytes of text the job's log keeps (a cell's output: ``CELL_OUTPUT_CAP``)."""
        self._send = send
        self._queue = queue
        self.cap = cap
        self.kept: dict[int | None, Kept] = {}  # by cell (None: the job's own lines)
        self._turn: list[LogLine] = []  # queue mode: this loop turn's lines, handed over together
        self._turn_size = 0
        self._backlog = 0  # lines handed on and not yet taken by the control plane
        self._backlog_size = 0
        self._roomy: asyncio.Future[None] | None = None
        self._unblocked = False
        self._clock = clock
        self.redactor = redactor
        self._redact = redactor.redact
        self._buf: list[LogLine] = []
        self._task: asyncio.Task[None] | None = None
        self._flush_interval = flush_interval
        self.sent = 0
        self.dropped = 0

    def add(
        self,
        stream: Stream,
        text: str,
        rank: int | None = None,
        cell: int | None = None,
        *,
        ends: bool = True,
    ) -> None:
        """A line (``ends=False``: a piece of a longer one, more to come) to ship."""
        self.add_line(self.line(stream, text, rank, cell), ends=ends)

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
        return make_line(self._clock.now(), stream, self._redact(text), rank, cell, data)

    def add_line(self, line: LogLine, *, ends: bool = True) -> None:
        """Queue a line made by :meth:`line`; it goes out at once unless a send is in flight.

        A long line goes in pieces; past its log's cap it is dropped (and counted, as lines:
        ``ends=False`` says more of this line follows)."""
        if line.data is None and len(line.text) <= LINE_PIECE:  # the common case, quickly
            size = self._admit(line, ends)
            if size >= 0:
                self._enqueue(line, size)
            return
        split = pieces(line)
        for i, piece in enumerate(split):
            size = self._admit(piece, ends and i == len(split) - 1)
            if size >= 0:
                self._enqueue(piece, size)

    def fit(self, lines: list[LogLine]) -> list[LogLine]:
        """``lines`` cut to ``LINE_PIECE`` and kept within their log's cap (the rest counted)."""
        out = []
        for line in lines:
            split = pieces(line)
            for i, piece in enumerate(split):
                if self._admit(piece, i == len(split) - 1) >= 0:
                    out.append(piece)
        return out

    def _admit(self, line: LogLine, ends: bool = True) -> int:
        """The line's size if its log keeps it, else -1 (counted as dropped: a line once, however
        many pieces it came in; ``ends``: this piece ends its line)."""
        size = utf8_len(line.text)
        if line.data is not None:
            size += len(json.dumps(line.data, default=str))
        if line.stream == "system":
            return size  # the worker's own lines (and the note itself) always go
        kept = self.kept.get(line.cell)
        if kept is None:
            kept = self.kept[line.cell] = Kept()
        cap, most = (self.cap, None) if line.cell is None else (CELL_OUTPUT_CAP, CELL_OUTPUT_LINES)
        if kept.dropped_lines or kept.size + size > cap or (most and kept.lines >= most):
            kept.dropped_lines += 0 if kept.open else 1
            kept.open = not ends
            kept.dropped_size += size
            return -1
        kept.size += size
        kept.lines += 1
        return size

    def note(self, cell: int | None = None, more: tuple[int, int] = (0, 0)) -> LogLine | None:
        """The one line saying what a log dropped past its cap (None: nothing was), and the
        count starts again; ``more``: (lines, bytes) dropped before they reached this worker
        (a session rank's own cap)."""
        kept = self.kept.pop(cell, None) or Kept()
        lines, size = kept.dropped_lines + more[0], kept.dropped_size + more[1]
        if not lines:
            return None
        if cell is None:
            text = dropped_note(lines, size, self.cap, "this job's log")
        else:
            text = dropped_note(lines, size, CELL_OUTPUT_CAP, "a cell's output")
            text += f" or {CELL_OUTPUT_LINES:,} lines"
        return self.line("system", text, cell=cell)

    def _enqueue(self, line: LogLine, size: int) -> None:
        self._backlog += 1
        self._backlog_size += size
        if self._queue is not None:
            self._turn.append(line)
            self._turn_size += size
            if len(self._turn) == 1:
                asyncio.get_running_loop().call_soon(self._hand_over)
            return
        self._buf.append(line)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._pump())

    def _hand_over(self) -> None:
        """Queue mode: this turn's lines to the reporter, in one call (one waiter for all)."""
        lines, self._turn, size, self._turn_size = self._turn, [], self._turn_size, 0
        if not lines or self._queue is None:
            return
        taken = self._queue(lines)
        self.sent += len(lines)
        if taken is None:
            self._taken(len(lines), size)
        else:
            taken.add_done_callback(lambda _: self._taken(len(lines), size))

    def _taken(self, lines: int, size: int) -> None:
        """Lines the control plane took (or that were given up on): room for more."""
        self._backlog -= lines
        self._backlog_size -= size
        if self._roomy is not None and not self._roomy.done() and not self._full():
            self._roomy.set_result(None)

    def _full(self) -> bool:
        return self._backlog > BACKLOG_LINES or self._backlog_size > BACKLOG_BYTES

    def unblock(self) -> None:
        """No more waiting for room: the job's main process is gone, and what its pipes still
        hold must be read within the drain's few seconds (it is at most a pipe's worth)."""
        self._unblocked = True
        if self._roomy is not None and not self._roomy.done():
            self._roomy.set_result(None)

    async def room(self) -> None:
        """Wait while too much output waits for the control plane (``BACKLOG_LINES``)."""
        while self._full() and not self._unblocked:
            self._hand_over()
            if self._roomy is None or self._roomy.done():
                self._roomy = asyncio.get_running_loop().create_future()
            await self._roomy

    async def settle(self) -> list[LogLine]:
        """Wait for the send in flight, then take (and no longer send) what is still queued:
        a session cell's last lines travel in its report instead, after all earlier ones."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
        lines, self._buf = self._buf, []
        self._taken(len(lines), sum(utf8_len(x.text) for x in lines))
        return lines

    async def _pump(self) -> None:
        while self._buf:
            batch, self._buf = self._buf[:MAX_BATCH], self._buf[MAX_BATCH:]
            try:
                await self._send_batch(batch)
            finally:
                self._taken(len(batch), sum(utf8_len(x.text) for x in batch))

    async def _send_batch(self, batch: list[LogLine]) -> None:
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
        """Send everything buffered, the note of what was dropped last; returns once the
        control plane has it."""
        note = self.note(None)
        if note is not None:
            self._enqueue(note, self._admit(note))
        self._hand_over()
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await self._task
        if self._buf:
            await self._pump()


class LineSink(Protocol):
    """Where a pipe's lines go: a :class:`LogShipper`, or a view of one (a session's rank)."""

    redactor: Redactor

    def add(
        self, stream: Stream, text: str, rank: int | None = None, *, ends: bool = True
    ) -> None: ...


async def _no_wait() -> None:
    return None


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
    # Backpressure: a sink that can say "wait" (a LogShipper) stops this read while its backlog
    # is full; the job's writes then block in the pipe instead of the worker's memory growing.
    room: Callable[[], Awaitable[None]] = getattr(shipper, "room", _no_wait)
    while True:
        await room()
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
            self.shipper.add(self.stream, tagged[1], tagged[0], ends=last)
