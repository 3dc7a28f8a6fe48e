"""Shipping log lines from a job to the control plane: batched, redacted, never late.

A line is sent at once when no send is in flight; lines that arrive while one is in flight are
batched into the next send (a Nagle without the delay). So a quiet job's line arrives in one round
trip, and a chatty job's lines go out in few, large batches. ``flush_interval`` bounds how long a
line can wait behind a slow send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from ..contracts import LogLine
from ..errors import Conflict, NotFound
from ..redact import Redactor

log = logging.getLogger("gpulayer.worker")

MAX_BATCH = 2_000
Stream = Literal["stdout", "stderr", "system"]
MAX_LINE = 64 * 1024


class LogShipper:
    def __init__(
        self,
        send: Callable[[list[LogLine]], Awaitable[None]],
        redactor: Redactor,
        flush_interval: float = 0.1,
    ) -> None:
        self._send = send
        self._redact = redactor.redact
        self._buf: list[LogLine] = []
        self._task: asyncio.Task[None] | None = None
        self._flush_interval = flush_interval
        self.sent = 0
        self.dropped = 0

    def add(self, stream: Stream, text: str, rank: int | None = None) -> None:
        self._buf.append(
            LogLine.model_construct(
                time=time.time(), stream=stream, rank=rank, text=self._redact(text)
            )
        )
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while self._buf:
            batch, self._buf = self._buf[:MAX_BATCH], self._buf[MAX_BATCH:]
            for attempt in range(5):
                try:
                    await asyncio.wait_for(self._send(batch), timeout=30)
                    self.sent += len(batch)
                    break
                except (Conflict, NotFound):
                    # The control plane no longer takes lines for this job (it ended, or its
                    # gang failed elsewhere): retrying cannot succeed.
                    self.dropped += len(batch)
                    break
                except Exception as exc:  # noqa: BLE001 - logs must not kill the job
                    log.warning("sending %d log lines failed (%s); retrying", len(batch), exc)
                    await asyncio.sleep(min(2.0, self._flush_interval * 2**attempt))
            else:
                self.dropped += len(batch)

    async def close(self) -> None:
        """Send everything buffered; returns once the control plane has it."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await self._task
        if self._buf:
            await self._pump()


async def pump_stream(
    reader: asyncio.StreamReader,
    stream: Stream,
    shipper: LogShipper,
    split_rank: Callable[[str], tuple[int | None, str]] | None = None,
) -> None:
    """Read a pipe to EOF and hand each complete line (without the newline) to the shipper."""
    partial = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        partial += chunk
        *lines, partial = partial.split(b"\n")
        for raw in lines:
            _emit(raw, stream, shipper, split_rank)
        while len(partial) > MAX_LINE:  # a line without end: ship it in pieces
            _emit(partial[:MAX_LINE], stream, shipper, split_rank)
            partial = partial[MAX_LINE:]
    if partial:
        _emit(partial, stream, shipper, split_rank)


def _emit(
    raw: bytes,
    stream: Stream,
    shipper: LogShipper,
    split_rank: Callable[[str], tuple[int | None, str]] | None,
) -> None:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    rank = None
    if split_rank is not None:
        rank, text = split_rank(text)
    shipper.add(stream, text, rank)
