"""The group commit of the SQL stores (ADR 0008): every write queued while a transaction runs
rides in the next one.

A write queues its rows (``_enqueue``, no await) and waits for the transaction that carries them
(``_write``); one flusher task commits the queue, then whatever was queued meanwhile, until it is
empty. A save returns only once its group is committed, and a failed transaction fails every
write it carried, with nothing of it applied (and nothing committed before it lost).

Rows of one statement are merged into one ``executemany`` unless another statement on the same
table came between them, so a transaction always ends where running the writes one by one would
have. What a write costs here is what the ≥ 50,000 transitions/s goal is about (issue 14): a
future, a list append and a dictionary lookup; the transaction's own cost is shared by the group.
"""

from __future__ import annotations

import abc
import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GPUlayerError, StoreError

_TABLE = re.compile(r"^\s*(?:INSERT(?: OR \w+)? INTO|DELETE FROM|UPDATE)\s+(\w+)", re.IGNORECASE)
_TABLES: dict[str, str] = {}  # statement -> the table it writes: statements are few and fixed


def table_of(sql: str) -> str:
    """The table a write statement touches (each touches one: no triggers, no joins)."""
    table = _TABLES.get(sql)
    if table is None:
        match = _TABLE.match(sql)
        if match is None:
            raise StoreError(f"cannot tell which table this write touches: {sql[:60]}")
        table = _TABLES[sql] = match.group(1).lower()
    return table


@dataclass(slots=True)
class Run:
    """Consecutive rows of one write statement, committed with one ``executemany``."""

    table: str
    sql: str
    rows: list[tuple[Any, ...]]


class GroupCommit(abc.ABC):
    """Queues writes and commits them a group at a time; a subclass runs one transaction."""

    def __init__(self) -> None:
        self._queue: list[Run] = []  # writes waiting for the next commit, in order (``_enqueue``)
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._later: asyncio.TimerHandle | None = None  # commits what ``_submit_within`` queued
        self.commits = 0  # transactions committed (tests count them: N writers, one commit)
        # Seconds each transaction took (the control plane's metrics histogram); one
        # perf_counter pair a group, not a write.
        self.on_commit: Callable[[float], None] | None = None

    @abc.abstractmethod
    async def _commit(self, queue: Sequence[Run]) -> None:
        """Run ``queue`` in order in one transaction (rolled back whole if any of it fails)."""

    def _write_error(self, exc: Exception) -> GPUlayerError:
        """What the writers of a failed transaction are told."""
        return StoreError(f"writing to the database failed: {exc}")

    async def _write(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Queue rows and return once the transaction that carries them is committed."""
        if rows:
            await self._submit(sql, rows)

    def _submit(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[None]:
        """Queue rows; the future is done once the transaction that carries them is committed
        (``_write`` without its coroutine, for the hottest callers: one frame less a write)."""
        fut = self._queued(sql, rows)
        self._kick()
        return fut

    def _submit_within(
        self, sql: str, rows: Sequence[tuple[Any, ...]], within: float
    ) -> asyncio.Future[None]:
        """Queue rows for the transaction the next write starts, or one of their own ``within``
        seconds from now, whichever comes first: for a write whose caller can wait, while the
        next one, which comes within milliseconds on a busy path, cannot (a session cell's end,
        answered from memory, rides with the next cell's start: one commit a cell, not two)."""
        fut = self._queued(sql, rows)
        if self._flusher is None and self._later is None:
            self._later = asyncio.get_running_loop().call_later(within, self._kick)
        return fut

    def _queued(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[None]:
        self._enqueue(sql, rows)
        # A future per writer, not one per group: a cancelled writer cancels only its own wait
        # (the write itself still lands), and it costs no more than a shared one (measured).
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def _kick(self) -> None:
        """Commit what is queued now: start the flusher unless it runs (it takes the queue)."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._flusher is None and self._queue:
            self._flusher = asyncio.create_task(self._flush())

    def _ride(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[None]:
        """``_submit`` for a write its caller need not await: it rides with the caller's own next
        write, whose failure is what the caller learns of, so its error is marked as seen."""
        if not rows:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        fut = self._submit(sql, rows)
        fut.add_done_callback(_seen)
        return fut

    def _enqueue(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Queue rows for the next commit so that it ends as running every write in order would.

        Rows join an earlier run of the same statement (one ``executemany``) unless another
        statement on the same table was queued after that run: a DELETE between two upserts of
        one key must stay between them. Statements on different tables touch different rows, so
        their runs may pass each other.
        """
        table = table_of(sql)
        for run in reversed(self._queue):
            if run.table != table:
                continue
            if run.sql == sql:
                run.rows.extend(rows)
                return
            break
        self._queue.append(Run(table, sql, list(rows)))

    async def _flush(self) -> None:
        waiters: list[asyncio.Future[None]] = []
        try:
            while self._queue:
                queue, waiters = self._queue, self._waiters
                self._queue, self._waiters = [], []
                began = time.perf_counter()
                try:
                    await self._commit(queue)
                except Exception as exc:
                    err = exc if isinstance(exc, GPUlayerError) else self._write_error(exc)
                    for w in waiters:
                        if not w.done():
                            w.set_exception(err)
                    continue
                self.commits += 1
                if self.on_commit is not None:
                    self.on_commit(time.perf_counter() - began)
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
        except BaseException:  # cancelled (the loop is going away): nobody may wait forever
            err = StoreError(
                "the store stopped before this write was confirmed; it may not have been saved",
                hint="read it back after the store is open again",
            )
            for w in [*waiters, *self._waiters]:
                if not w.done():
                    w.set_exception(err)
            raise
        finally:
            self._flusher = None

    async def _drain(self) -> None:
        """Let the writes already queued finish (before closing), those queued for later too."""
        self._kick()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


def _seen(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()
