"""Job logs: numbering, server-side redaction, in-memory tails of active jobs, and reading pages.

Active jobs' recent lines stay in memory: each store read is a thread hop, and a job's end is
exactly when every waiter reads them. So an ended job's tail stays a little longer, among the
last ``ENDED_TAILS`` ended (``ENDED_BYTES`` of them at most): the followers its end wakes read it
a moment after, without the hop. Older ended jobs' lines, and any job's once a late line came
after its end (a cancel's note), are read from the store.

Memory is bounded by bytes, not by counts (issue 32): a record can be a 64 KiB piece of a long
line, and a piece of emoji is 256 KiB as a Python string. Each tail keeps at most ``TAIL_BYTES``
of its newest records, all tails together at most ``TAILS_BYTES`` (past it the largest tails give
way first), and a page read from a tail or the store carries about ``PAGE_BYTES`` at most (never
less than one record): what falls off a tail is read from the store, a page at a time.

Lines are never lost to a store that is away (``Unavailable``: a restart, a failover): those a
write could not store are kept, in order and numbered, and written once it answers (``outage.py``,
as the job table does with its dirty jobs). That covers the control plane's own lines and a
worker's batched reports: the report is refused all the same (it was not stored when answered),
and a worker does not send a refused entry's lines again, so they are written once. A worker's
single log and cell requests are retried on a 503 instead: their lines are not kept (``keep``).
A control plane that closes meanwhile gives them, and its dirty jobs, one last try and warns of
what is lost (``Wiring._last_writes``).

A log is capped (``contracts/limits.py``): a job's own lines at ``JOB_LOG_CAP`` bytes, each session
cell's at ``CELL_OUTPUT_CAP`` bytes and ``CELL_OUTPUT_LINES`` lines. Workers drop what is past the
cap and say so; this side stores up to ``SERVER_SLACK`` more (their pieces and their note), then
drops the rest and says so once, so a worker that does not cap cannot fill the disk. The counts
start again when the control plane does.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence

from .. import display
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Job, LogLine, LogPage, LogRecord
from ..contracts._base import built
from ..contracts.limits import (
    CELL_OUTPUT_CAP,
    CELL_OUTPUT_LINES,
    JOB_LOG_CAP,
    SERVER_SLACK,
    SERVER_SLACK_LINES,
)
from ..display import human_bytes
from ..errors import Unavailable
from ..redact import Redactor
from ..store import MetadataStore
from . import trim
from .outage import WhenBack

MAX_LOG_PAGE = 5_000  # records one page carries at most
TAIL_BYTES = 4 << 20  # bytes of records one active job's tail keeps in memory
TAILS_BYTES = 64 << 20  # bytes every tail keeps together: past it the largest give way
PAGE_BYTES = 4 << 20  # bytes of records one page carries (at least one record)
ENDED_TAILS = 64  # ended jobs whose tails stay for the readers their end woke
ENDED_BYTES = 8 << 20  # bytes those ended tails keep together


class LogTails:
    """Appends and reads job log records; wakes the job's waiters with ``wake(job_id)``."""

    def __init__(
        self,
        store: MetadataStore,
        redactor: Redactor,
        *,
        wake: Callable[[str], None],
        changed: Callable[[str, float], Awaitable[bool]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.redactor = redactor
        self.clock = clock
        self._wake = wake
        self._changed = changed
        self._seq: dict[str, int] = {}  # last seq per job this process has written
        self._tails: dict[str, _Tail] = {}
        self._held = 0  # bytes of records in every tail together
        self._ended: dict[str, _Tail] = {}  # the last ended jobs' tails, oldest first
        self._ended_held = 0
        # Bytes and lines stored per log (a job's own lines: cell None), and those past its cap.
        self._kept: dict[tuple[str, int | None], list[int]] = {}
        # Records a write could not store while the store was away, per job, in order.
        self._unsaved: dict[str, list[LogRecord]] = {}
        self._resync = WhenBack(lambda: bool(self._unsaved), self.resync, clock, "log line")

    def close(self) -> None:
        """Stop retrying kept records (the control plane is closing)."""
        self._resync.close()

    @property
    def unsaved(self) -> int:
        """Records kept for the store, not written yet."""
        return sum(len(r) for r in self._unsaved.values())

    def open(self, job_id: str) -> None:
        """A new job: its log starts empty and its tail lives here until it ends."""
        self._seq[job_id] = 0
        self._tails[job_id] = _Tail()

    def numbered(self, job_id: str) -> bool:
        """Whether this process numbers the job's lines already (``append`` then writes without
        reading the store first)."""
        return job_id in self._seq

    def forget(self, job_id: str) -> None:
        """A finished job: late lines (a cancel's note) count on from the store. Its tail joins
        the ended ones (the oldest of those go) for the readers its end woke."""
        self._seq.pop(job_id, None)
        tail = self._tails.pop(job_id, None)
        if tail is not None:
            self._held -= tail.size
            self._ended[job_id] = tail
            self._ended_held += tail.size
            while self._ended and (
                len(self._ended) > ENDED_TAILS or self._ended_held > ENDED_BYTES
            ):
                self._drop_ended(next(iter(self._ended)))
        for key in [k for k in self._kept if k[0] == job_id]:
            del self._kept[key]

    def _drop_tail(self, job_id: str) -> None:
        tail = self._tails.pop(job_id, None)
        if tail is not None:
            self._held -= tail.size
            trim.freed(tail.size)

    def _drop_ended(self, job_id: str) -> None:
        tail = self._ended.pop(job_id, None)
        if tail is not None:
            self._ended_held -= tail.size
            trim.freed(tail.size)

    @property
    def held(self) -> int:
        """Bytes of records the active jobs' tails hold now (``TAILS_BYTES`` at most, give or take
        a page)."""
        return self._held

    @property
    def ended_held(self) -> int:
        """Bytes of records the ended jobs' tails hold now (``ENDED_BYTES`` at most)."""
        return self._ended_held

    def _keep(self, tail: _Tail, records: list[LogRecord]) -> None:
        """Add ``records`` to ``tail``, then trim it to ``TAIL_BYTES`` and every tail together to
        ``TAILS_BYTES``; what falls off is read from the store."""
        self._held += tail.add(records)
        freed = tail.shrink(TAIL_BYTES)
        self._held -= freed
        if self._held > TAILS_BYTES:
            # The largest give way first, each to half of a fair share: a few tails shrink at
            # a time, and the next appends find room (the scan is rare, not per append).
            share = TAILS_BYTES // (2 * len(self._tails))
            for big in sorted(self._tails.values(), key=lambda t: t.size, reverse=True):
                if self._held <= TAILS_BYTES * 3 // 4:
                    break
                shed = big.shrink(share)
                self._held -= shed
                freed += shed
        trim.freed(freed)

    async def system(self, job_id: str, text: str) -> int:
        """A line from the control plane itself (placement, retries, why it stopped)."""
        return await self.append(
            job_id, [LogLine(time=self.clock.now(), stream="system", text=text)], capped=False
        )

    def _capped(self, job_id: str, lines: Sequence[LogLine]) -> list[LogLine]:
        """``lines`` less what is past its log's cap (and slack); one note where it starts."""
        out: list[LogLine] = []
        for line in lines:
            key = (job_id, line.cell)
            kept = self._kept.get(key)
            if kept is None:
                kept = self._kept[key] = [0, 0, 0]  # bytes, lines, dropped lines
            size = len(line.text) + (0 if line.data is None else _data_size(line.data))
            cap, most = (
                (JOB_LOG_CAP, None) if line.cell is None else (CELL_OUTPUT_CAP, CELL_OUTPUT_LINES)
            )
            past = kept[0] + size > cap + SERVER_SLACK or (
                most and kept[1] >= most + SERVER_SLACK_LINES
            )
            if not (past or kept[2]):
                kept[0] += size
                kept[1] += 1
                out.append(line)
                continue
            kept[2] += 1
            if kept[2] == 1:
                what = "this job's log" if line.cell is None else "a cell's output"
                text = (
                    f"[gpulayer] output dropped: {what} is capped at {human_bytes(cap)} (the "
                    "worker sent more; the control plane dropped the rest)"
                )
                out.append(line.model_copy(update={"stream": "system", "text": text, "data": None}))
        return out

    async def append(
        self, job_id: str, lines: Sequence[LogLine], *, capped: bool = True, keep: bool = True
    ) -> int:
        """Number, redact and store ``lines``; returns the job's last seq. ``capped``: what is
        past its log's cap is dropped (the control plane's own lines are not). ``keep``: lines
        the store could not take (it is away) are kept and written once it answers; False where
        the sender sends refused lines again (a worker's log and cell requests, retried on a
        503): kept, they would be stored twice."""
        if capped:
            lines = self._capped(job_id, lines)
        if not lines:
            return self._seq.get(job_id, 0)
        seq = await self.last_seq(job_id)
        records = []
        redact = self.redactor.redact
        for line in lines:
            seq += 1
            # Second layer of redaction: workers redact first; a missed value stops here.
            data = line.data
            if data is not None:
                data = display.redact(data, redact)
            records.append(
                _record(seq, line.time, line.stream, line.rank, redact(line.text), line.cell, data)
            )
        self._seq[job_id] = seq
        tail = self._tails.get(job_id)
        if tail is not None:
            self._keep(tail, records)
        try:
            await self.store.append_logs(job_id, records)
        except Unavailable:
            if not keep:
                # Sent again later: its numbers must be free, and its tail must not show it
                # twice. The store is the whole truth for this job from here on.
                self._seq.pop(job_id, None)
                self._drop_tail(job_id)
                raise
            # Numbered and in the tail already: kept, and written once the store answers.
            self._unsaved.setdefault(job_id, []).extend(records)
            self._resync.kick()
            raise
        self._wake(job_id)
        return seq

    async def resync(self) -> None:
        """Write the kept records now (Unavailable while the store is still away)."""
        for job_id in list(self._unsaved):
            records = self._unsaved.pop(job_id, [])
            try:
                await self.store.append_logs(job_id, records)  # a repeat is a no-op
            except BaseException:
                self._unsaved[job_id] = records + self._unsaved.get(job_id, [])
                raise
            self._wake(job_id)

    async def last_seq(self, job_id: str) -> int:
        """The job's last log seq (from the store once, for a job this process did not open or
        that ended: lines numbered from there reach the store only, so its ended tail goes)."""
        if job_id not in self._seq:
            self._drop_ended(job_id)
            stored = await self.store.max_log_seq(job_id)
            kept = self._unsaved.get(job_id)
            self._seq[job_id] = max(stored, kept[-1].seq if kept else 0)
        return self._seq[job_id]

    async def read(self, job_id: str, since: int, limit: int) -> list[LogRecord]:
        """Up to ``limit`` records after ``since`` and about ``PAGE_BYTES`` (at least one)."""
        return (await self.read_more(job_id, since, limit))[0]

    async def read_more(self, job_id: str, since: int, limit: int) -> tuple[list[LogRecord], bool]:
        """As ``read``, and whether more records wait after them (a full or a cut page)."""
        tail = self._tails.get(job_id) or self._ended.get(job_id)
        if tail is not None and tail.covers(since):
            return tail.after(since, limit, PAGE_BYTES)
        return await self.store.read_log_page(job_id, since, limit, PAGE_BYTES)

    async def page(
        self,
        job_id: str,
        current: Callable[[], Awaitable[Job]],
        since: int = 0,
        wait: float = 0.0,
        limit: int = 1000,
    ) -> LogPage:
        """Records after ``since``; with ``wait`` > 0, long-poll until one arrives (or it ends)."""
        limit = max(1, min(limit, MAX_LOG_PAGE))
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            now_state = (await current()).state
            records, _ = await self.read_more(job_id, since, limit)
            left = deadline - self.clock.monotonic()
            if records or now_state.terminal or left <= 0:
                next_since = records[-1].seq if records else since
                return LogPage(
                    job_id=job_id, records=records, next_since=next_since, state=now_state
                )
            await self._changed(job_id, left)


def _record(
    seq: int,
    time: float,
    stream: str,
    rank: int | None,
    text: str,
    cell: int | None,
    data: Mapping[str, object] | None,
) -> LogRecord:
    """A record built unchecked (``contracts.built``): ``model_construct`` was most of the control
    plane's time per line of a chatty job, and every part is checked already."""
    fields = {"seq": seq, "time": time, "stream": stream, "rank": rank, "text": text}
    return built(LogRecord, {**fields, "cell": cell, "data": data})


def _data_size(data: Mapping[str, object]) -> int:
    """Roughly the bytes a display holds (its string values: base64 images, HTML)."""
    inner = data.get("data")
    values = inner.values() if isinstance(inner, dict) else ()
    return sum(len(v) for v in values if isinstance(v, str)) + 64


RECORD_OVERHEAD = 200  # bytes of a record's object and its small fields


def record_size(r: LogRecord) -> int:
    """The bytes a record holds in memory: its text as Python keeps it (1, 2 or 4 bytes a
    character), its display data, and the record itself."""
    data = 0 if r.data is None else _data_size(r.data)
    return sys.getsizeof(r.text) + data + RECORD_OVERHEAD


class _Tail:
    """One active job's newest records in memory, with their size in bytes."""

    __slots__ = ("records", "sizes", "size")

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self.sizes: list[int] = []
        self.size = 0

    def add(self, records: list[LogRecord]) -> int:
        sizes = [record_size(r) for r in records]
        self.records += records
        self.sizes += sizes
        added = sum(sizes)
        self.size += added
        return added

    def shrink(self, most: int) -> int:
        """Drop the oldest records until at most ``most`` bytes are left; the bytes freed."""
        drop = freed = 0
        while drop < len(self.records) and self.size - freed > most:
            freed += self.sizes[drop]
            drop += 1
        if drop:
            del self.records[:drop]
            del self.sizes[:drop]
            self.size -= freed
        return freed

    def covers(self, since: int) -> bool:
        """Whether every record after ``since`` is here (none fell off before it)."""
        return not self.records or self.records[0].seq <= since + 1

    def after(self, since: int, limit: int, budget: int) -> tuple[list[LogRecord], bool]:
        start = max(0, since - self.records[0].seq + 1) if self.records else 0
        end = min(len(self.records), start + limit)
        size = 0
        for i in range(start, end):
            size += self.sizes[i]
            if size > budget and i > start:
                end = i
                break
        return self.records[start:end], end < len(self.records)
