"""One worker's reports to its control plane, coalesced (protocol 1.1, ADR 0003).

What a worker says about its jobs (an attempt started, its log lines, its progress, its end)
goes through its :class:`Reporter`. Everything about one attempt merges into one
:class:`~gpulayer_kernel.contracts.JobReport`; the entries of all the worker's jobs go out
together, one batch at a time (``Transport.report``: one request over HTTP), and what arrives
while a batch is in flight goes in the next (a Nagle without the delay). So a worker running many
short jobs sends their ends in a few requests, not four each.

An attempt's start, and what it prints before the control plane knows it runs, wait up to
``linger`` seconds for what follows: a job that ends sooner is one entry from its start to its
result (one request, and one write of its row on the control plane). Its end never waits, nor
does anything about an attempt the control plane already knows as running; a cell's first line
arrives at most ``linger`` late, later ones as soon as they are printed.

The linger is a coalescing window, not a timeout: it runs on the event loop's own clock, so a test's
``FakeClock`` never holds a report back (retries and their backoff run on ``clock``).

A batch fits every limit the control plane enforces (``contracts/limits.py``): at most
``MAX_BATCH`` entries, ``MAX_LINES`` lines an entry and ``MAX_BODY`` bytes in all, measured on the
lines' JSON. An attempt with more queued sends its first lines now and the rest in the next
batches, in order; its start goes with its first lines, its progress and end with its last.

Each call returns a future that resolves when its entry was taken, or raises the error the
control plane refused that entry with (the rest of the batch goes through). A batch the control
plane could not take (unreachable, restarting: ``Unavailable``; or sent on a session the worker
has just replaced: ``Unauthorized``) is sent again after a backoff, for ``retry_for`` seconds
(its waiters then get the error; the agent keeps re-sending an end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import FinishReport, JobReport, LogLine
from ..contracts.limits import MAX_BATCH, MAX_BODY, MAX_LINES
from ..errors import GPUlayerError, Unauthorized, Unavailable
from .backoff import backoff
from .fitting import ENVELOPE, line_size, utf8_len

log = logging.getLogger("gpulayer.worker")

Attempt = tuple[str, int | None]
Send = Callable[[Sequence[JobReport]], Awaitable[Sequence[GPUlayerError | None]]]
RUNNING_KEPT = 4_096  # attempts remembered as known to be running (their lines never wait)


@dataclass
class _Entry:
    """What is queued about one attempt, and who waits for it to be taken."""

    job_id: str
    attempt: int | None
    since: float  # when its first item was queued (the event loop's time)
    started: bool = False
    lines: list[LogLine] = field(default_factory=list)
    progress: dict[str, Any] | None = None
    finished: FinishReport | None = None
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def report(self) -> JobReport:
        # Built without validation: every part was made (and checked) by this worker.
        return JobReport.model_construct(
            job_id=self.job_id,
            attempt=self.attempt,
            started=self.started,
            lines=self.lines,
            progress=self.progress,
            finished=self.finished,
        )

    def overhead(self) -> int:
        """Bytes of the entry's JSON without its lines (its end's result can be 1 MiB)."""
        bare = self.report().model_copy(update={"lines": []})
        return utf8_len(bare.model_dump_json(exclude_none=True)) + 1

    def take(self, budget: int, first: bool) -> tuple[_Entry | None, int]:
        """Split off what fits ``budget`` bytes and ``MAX_LINES`` lines: (that part, its size).

        The part is this entry itself when all of it fits; otherwise a new entry with the
        first lines (and the start), this one keeping the rest, its progress, end and waiters.
        None when not even its first line fits, unless it is the ``first`` of its batch (then
        it takes one line, so that every batch makes progress).
        """
        size = self.overhead()
        n = 0
        for line in self.lines[:MAX_LINES]:
            more = line_size(line)
            if size + more > budget and not (first and n == 0):
                break
            size += more
            n += 1
        if n == len(self.lines) and (size <= budget or first):
            return self, size
        if n == 0:  # not the first of its batch: it waits for the next
            return None, 0
        head = _Entry(self.job_id, self.attempt, self.since, self.started, self.lines[:n])
        self.started, self.lines = False, self.lines[n:]
        return head, size

    def absorb(self, later: _Entry) -> None:
        """Add what was queued after this entry (it goes out after it, in the same report)."""
        self.started = self.started or later.started
        self.lines += later.lines
        self.progress = later.progress if later.progress is not None else self.progress
        self.finished = later.finished or self.finished
        self.waiters += later.waiters


class Reporter:
    """A worker's reports, merged per attempt and sent in batches (``send``: the transport's)."""

    def __init__(
        self,
        send: Send,
        *,
        clock: Clock = SYSTEM_CLOCK,
        linger: float = 0.05,
        retry_for: float = 120.0,
    ) -> None:
        self._send = send
        self.clock = clock
        self.linger = linger
        self.retry_for = retry_for
        self._pending: dict[Attempt, _Entry] = {}
        self._running: dict[Attempt, None] = {}  # the control plane knows they run
        self._task: asyncio.Task[None] | None = None
        self._nudge: asyncio.Future[None] | None = None
        self.batches = 0  # batches sent (for tests and diagnostics)

    # -- what the executors and the agent say ----------------------------------------------------

    def started(self, job_id: str, attempt: int | None) -> asyncio.Future[None]:
        return self._add(job_id, attempt, started=True)

    def logs(self, job_id: str, attempt: int | None, lines: list[LogLine]) -> asyncio.Future[None]:
        return self._add(job_id, attempt, lines=list(lines))

    def progress(
        self, job_id: str, attempt: int | None, fields: dict[str, Any]
    ) -> asyncio.Future[None]:
        return self._add(job_id, attempt, progress=fields)

    def finished(
        self, job_id: str, attempt: int | None, report: FinishReport
    ) -> asyncio.Future[None]:
        self._running.pop((job_id, attempt), None)
        return self._add(job_id, attempt, finished=report)

    async def close(self) -> None:
        """Wait for what is queued to be sent (or given up on)."""
        while self._task is not None and not self._task.done():
            self._poke()
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)

    # -- the queue -------------------------------------------------------------------------------

    def _add(self, job_id: str, attempt: int | None, **parts: Any) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        item = _Entry(job_id, attempt, loop.time(), waiters=[waiter], **parts)
        key = (job_id, attempt)
        queued = self._pending.get(key)
        if queued is None:
            self._pending[key] = item
        else:
            queued.absorb(item)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        else:
            self._poke()
        return waiter

    def _poke(self) -> None:
        if self._nudge is not None and not self._nudge.done():
            self._nudge.set_result(None)

    def _wait(self, key: Attempt, entry: _Entry) -> float:
        """Seconds ``entry`` may still wait for what follows (0: it goes now)."""
        if entry.finished is not None or key in self._running:
            return 0.0
        return max(0.0, entry.since + self.linger - asyncio.get_running_loop().time())

    async def _run(self) -> None:
        while self._pending:
            left = min(self._wait(k, e) for k, e in self._pending.items())
            if left > 0:
                self._nudge = asyncio.get_running_loop().create_future()
                try:
                    await asyncio.wait([self._nudge], timeout=left)
                finally:
                    self._nudge = None
                continue
            await self._deliver(self._batch())

    def _batch(self) -> list[tuple[Attempt, _Entry]]:
        """The next batch, fitting every limit; what does not fit stays queued, in order."""
        budget = MAX_BODY - ENVELOPE
        batch: list[tuple[Attempt, _Entry]] = []
        for key in list(self._pending)[:MAX_BATCH]:
            entry = self._pending[key]
            part, size = entry.take(budget, first=not batch)
            if part is None:
                break
            batch.append((key, part))
            budget -= size
            if part is entry:
                del self._pending[key]
            else:
                break  # the batch is full; the attempt's rest goes first in the next one
        return batch

    async def _deliver(self, batch: list[tuple[Attempt, _Entry]]) -> None:
        reports = [entry.report() for _, entry in batch]
        deadline = self.clock.monotonic() + self.retry_for
        tries = 0
        while True:
            try:
                self.batches += 1
                outcomes = await self._send(reports)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # 401: this worker's session was replaced (a re-join, the full probe's
                # re-registration) while the batch was in flight; sent again on the new one.
                transient = not isinstance(exc, GPUlayerError) or isinstance(
                    exc, Unavailable | Unauthorized
                )
                if not transient or self.clock.monotonic() >= deadline:
                    for _, entry in batch:
                        _settle(entry.waiters, exc)
                    return
                delay = backoff(tries)
                tries += 1
                log.warning(
                    "reporting %d job(s) failed (%s); retrying in %.1fs", len(batch), exc, delay
                )
                await self.clock.sleep(delay)
        for (key, entry), outcome in zip(batch, outcomes, strict=True):
            rest = self._pending.get(key)
            if outcome is not None and rest is not None and entry is not rest and not entry.waiters:
                # A first part refused: the rest of the attempt's lines would be too.
                del self._pending[key]
                _settle(rest.waiters, outcome)
            if outcome is None and entry.started and entry.finished is None:
                self._running[key] = None
                while len(self._running) > RUNNING_KEPT:
                    self._running.pop(next(iter(self._running)))
            _settle(entry.waiters, outcome)


def _settle(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for w in waiters:
        if w.done():
            continue
        if error is None:
            w.set_result(None)
        else:
            w.set_exception(error)
    if error is not None:
        for w in waiters:  # nobody may be left waiting: mark the error seen
            if not w.cancelled():
                w.exception()
