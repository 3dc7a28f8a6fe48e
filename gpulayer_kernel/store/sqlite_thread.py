"""The one thread that owns the SQLite store's connection: every transaction and read runs there.

The event loop hands it work (``call``) and gets the answer back by ``call_soon_threadsafe``; a
whole group commit is one hand-off, never one per statement. Owning the thread (instead of
aiosqlite, whose public calls are one hop per statement) buys three things:

- **Answers in batches.** Work queued while the thread was busy runs back to back and all its
  answers go to the loop in one wake-up (one write to the loop's self-pipe, not one per call).
- **Checkpoints off the commit path.** SQLite's automatic checkpoint runs *inside* the COMMIT that
  crosses 1,000 WAL pages, so a group's writers would wait for it (it copies pages into the
  database file and fsyncs it: most of a group's time on a busy store). Here it is turned off and
  the thread checkpoints after the group's writers were answered: every ``CHECKPOINT_ROWS`` rows
  written, or once the store has been quiet for ``CHECKPOINT_IDLE`` seconds. A page that several
  groups rewrite (a job's row, four times in its life) is then copied once, not once per group.
  Durability is unchanged: a commit is in the WAL before its writers hear of it, as before
  (WAL, ``synchronous=NORMAL``); the checkpoint only moves pages from the WAL into the file.
- **No private API.** The store no longer reaches into aiosqlite's ``_execute`` and ``_conn``.

The thread is a daemon: a process that exits without closing its store loses nothing committed
(SQLite's WAL is crash-safe), and a forgotten store cannot keep the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import StoreError

T = TypeVar("T")
Answer = tuple["asyncio.Future[Any]", Any, BaseException | None]

CHECKPOINT_ROWS = 20_000  # a busy store checkpoints about every this many rows written ...
CHECKPOINT_IDLE = 0.5  # ... a quiet one this long after its last write
_STOP = object()


class SqliteThread:
    """A thread with one ``sqlite3`` connection; ``call`` runs ``fn(connection, *args)`` there."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str = "gpulayer-sqlite"):
        self._connect = connect
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._lock = threading.Lock()  # ``call`` never hands work to a thread that has ended
        self._ended = False
        self.checkpoint_rows = CHECKPOINT_ROWS
        self.checkpoint_idle = CHECKPOINT_IDLE
        self.checkpoints = 0  # how many the thread ran (tests read it)
        self._rows_since_checkpoint = 0
        self._last_write = 0.0

    def start(self) -> None:
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any, rows: int = 0) -> T:
        """Run ``fn(connection, *args)`` on the thread; ``rows``: how many rows it writes (what
        the checkpoint counts; 0 for a read)."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._ended:
                raise _closed()
            self._inbox.put((fn, args, rows, fut))
        return await fut

    async def stop(self) -> None:
        """Close the connection once the work already handed over has run; end the thread."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._ended or not self._thread.is_alive():
                return
            self._inbox.put((_STOP, (), 0, fut))
        await fut
        self._thread.join()  # its last act was to answer: it is returning now

    # -- on the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        failed: BaseException | None = None
        try:
            conn = self._connect()
        except BaseException as exc:  # each caller learns why, until the store is stopped
            failed = exc
        stopped: list[Answer] = []
        while not stopped:
            item = self._next()
            if item is None:  # quiet for checkpoint_idle seconds after writes
                if conn is not None:
                    self._checkpoint(conn)
                continue
            batch = [item]
            while True:  # what queued meanwhile runs now; its answers go back together
                try:
                    batch.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            answers: list[Answer] = []
            for fn, args, rows, fut in batch:
                if fn is _STOP:
                    if conn is not None:
                        conn.close()
                    conn, failed = None, None
                    stopped.append((fut, None, None))
                elif conn is None:
                    answers.append((fut, None, failed or _closed()))
                else:
                    try:
                        answers.append((fut, fn(conn, *args), None))
                    except BaseException as exc:
                        answers.append((fut, None, exc))
                    if rows:
                        self._rows_since_checkpoint += rows
                        self._last_write = time.monotonic()
            _answer(answers)
            if conn is not None and self._rows_since_checkpoint >= self.checkpoint_rows:
                self._checkpoint(conn)
        with self._lock:  # nothing can be queued from now on: answer what was, then the stop
            self._ended = True
        while True:
            try:
                stopped.insert(0, (self._inbox.get_nowait()[3], None, _closed()))
            except queue.Empty:
                break
        _answer(stopped)

    def _next(self) -> Any:
        """The next piece of work; None once the store has been quiet long enough to checkpoint."""
        if not self._rows_since_checkpoint:
            return self._inbox.get()
        wait = self._last_write + self.checkpoint_idle - time.monotonic()
        try:
            return self._inbox.get(timeout=max(wait, 0.0))
        except queue.Empty:
            return None

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        # PASSIVE: copies what no reader still needs and never waits for a reader or a writer
        # of another connection; what it could not copy waits for the next one.
        self._rows_since_checkpoint = 0
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:  # busy or locked by another connection: the next one copies it
            return
        self.checkpoints += 1


def _closed() -> StoreError:
    return StoreError("the store is closed", hint="open it again (await store.open())")


def _answer(answers: list[Answer]) -> None:
    """Hand answers to their loops: one wake-up per loop for the whole batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Answer]] = {}
    for answer in answers:
        by_loop.setdefault(answer[0].get_loop(), []).append(answer)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, items)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _settle(items: list[Answer]) -> None:
    for fut, result, exc in items:
        if fut.done():  # its caller was cancelled; the work itself was done
            continue
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
