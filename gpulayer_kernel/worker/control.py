"""The job's control channel: progress messages it writes to ``$GPULAYER_CONTROL`` (a FIFO)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("gpulayer.worker")


class ControlReader:
    """Reads progress messages from the job's FIFO without blocking the loop or polling."""

    def __init__(self, path: Path, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self._report = report
        self._buf = b""
        os.mkfifo(path, 0o600)
        # Open the read end first (non-blocking), then our own write end so the reader never sees
        # EOF when the job closes its end: EOF on a FIFO would make the fd readable forever.
        self.rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.rfd, self._readable)
        self._tasks: set[asyncio.Task[None]] = set()

    def _readable(self) -> None:
        try:
            chunk = os.read(self.rfd, 65536)
        except BlockingIOError:
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("kind") == "progress":
                fields = msg.get("fields")
                if isinstance(fields, dict):
                    t = asyncio.create_task(self._progress(fields))
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)

    async def _progress(self, fields: dict[str, Any]) -> None:
        try:
            await self._report(fields)
        except Exception as exc:
            log.debug("progress report failed: %s", exc)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._readable()  # drain what the job wrote last
        self._loop.remove_reader(self.rfd)
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
