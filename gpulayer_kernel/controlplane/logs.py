"""Job logs: numbering, server-side redaction, in-memory tails of active jobs, and reading pages.

Active jobs' recent lines stay in memory: each store read is a thread hop, and a job's end is
exactly when every waiter reads them. A finished job's lines are read from the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from .. import display
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Job, LogLine, LogPage, LogRecord
from ..redact import Redactor
from ..store import MetadataStore

MAX_LOG_PAGE = 5_000
TAIL_CACHE = 5_000
TAIL_DATA = 32 << 20  # bytes of display data (a session's figures) one tail holds at most


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
        self._tails: dict[str, list[LogRecord]] = {}
        self._data_bytes: dict[str, int] = {}  # display data held in a tail

    def open(self, job_id: str) -> None:
        """A new job: its log starts empty and its tail lives here until it ends."""
        self._seq[job_id] = 0
        self._tails[job_id] = []

    def numbered(self, job_id: str) -> bool:
        """Whether this process numbers the job's lines already (``append`` then writes without
        reading the store first)."""
        return job_id in self._seq

    def forget(self, job_id: str) -> None:
        """A finished job: late lines (a cancel's note) count on from the store."""
        self._seq.pop(job_id, None)
        self._tails.pop(job_id, None)
        self._data_bytes.pop(job_id, None)

    def _trim(self, job_id: str, tail: list[LogRecord]) -> None:
        """Keep the tail to ``TAIL_CACHE`` records and ``TAIL_DATA`` bytes of display data (a
        session's figures); what falls off is read from the store."""
        held = self._data_bytes.get(job_id, 0)
        drop = 0
        while drop < len(tail) - 1 and (len(tail) - drop > TAIL_CACHE or held > TAIL_DATA):
            data = tail[drop].data
            if data is not None:
                held -= _data_size(data)
            drop += 1
        if drop:
            del tail[:drop]
        self._data_bytes[job_id] = held

    async def system(self, job_id: str, text: str) -> int:
        """A line from the control plane itself (placement, retries, why it stopped)."""
        return await self.append(
            job_id, [LogLine(time=self.clock.now(), stream="system", text=text)]
        )

    async def append(self, job_id: str, lines: Sequence[LogLine]) -> int:
        """Number, redact and store ``lines``; returns the job's last seq."""
        if not lines:
            return self._seq.get(job_id, 0)
        if job_id not in self._seq:
            self._seq[job_id] = await self.store.max_log_seq(job_id)
        seq = self._seq[job_id]
        records = []
        redact = self.redactor.redact
        for line in lines:
            seq += 1
            # Second layer of redaction: workers redact first; a missed value stops here.
            data = line.data
            if data is not None:
                data = display.redact(data, redact)
                self._data_bytes[job_id] = self._data_bytes.get(job_id, 0) + _data_size(data)
            records.append(
                LogRecord.model_construct(
                    seq=seq,
                    time=line.time,
                    stream=line.stream,
                    rank=line.rank,
                    text=redact(line.text),
                    cell=line.cell,
                    data=data,
                )
            )
        self._seq[job_id] = seq
        tail = self._tails.get(job_id)
        if tail is not None:
            tail.extend(records)
            self._trim(job_id, tail)
        await self.store.append_logs(job_id, records)
        self._wake(job_id)
        return seq

    async def last_seq(self, job_id: str) -> int:
        """The job's last log seq (from the store once, for a job this process did not open)."""
        if job_id not in self._seq:
            self._seq[job_id] = await self.store.max_log_seq(job_id)
        return self._seq[job_id]

    async def read(self, job_id: str, since: int, limit: int) -> list[LogRecord]:
        tail = self._tails.get(job_id)
        if tail is not None and (not tail or tail[0].seq <= since + 1):
            start = max(0, since - tail[0].seq + 1) if tail else 0
            return tail[start : start + limit]
        return await self.store.read_logs(job_id, since, limit)

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
            records = await self.read(job_id, since, limit)
            left = deadline - self.clock.monotonic()
            if records or now_state.terminal or left <= 0:
                next_since = records[-1].seq if records else since
                return LogPage(
                    job_id=job_id, records=records, next_since=next_since, state=now_state
                )
            await self._changed(job_id, left)


def _data_size(data: Mapping[str, object]) -> int:
    """Roughly the bytes a display holds (its string values: base64 images, HTML)."""
    inner = data.get("data")
    values = inner.values() if isinstance(inner, dict) else ()
    return sum(len(v) for v in values if isinstance(v, str)) + 64
