"""A job's progress in a terminal, for ``gpulayer run``: one live line, or a line now and then.

On a terminal (stderr is a TTY) the progress (``step 120/1,000 (12%) · loss 0.41 · 41,230
samples/s``, worded by ``render.progress``) is one line at the bottom, redrawn in place; a log
line printed meanwhile first erases it and it is drawn again below, so logs scroll above it.
Piped or redirected, it is a plain ``gpulayer: progress: …`` line at most every
``render.PROGRESS_EVERY`` seconds, without repeating validation figures that did not change.

The progress comes from the control plane's event stream (``watch``): a Trainer reports every
``log_every`` steps, and each report is one event.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

from ..client.connect import Connection, job_changes
from ..contracts import Job

ERASE = "\r\x1b[K"  # back to column 0, clear to the end of the line


class LiveLine:
    """Shows one job's progress on ``stream`` (stderr); logs go out through :meth:`above`."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from .. import render  # here, not at the top: `gpulayer run` needs it once the job runs

        self.stream = stream or sys.stderr
        self.tty = bool(self.stream.isatty()) if tty is None else tty
        self._every = render.PROGRESS_EVERY if every is None else every
        self._clock = clock
        self._text = ""  # the progress as last worded
        self._drawn = False  # the live line is on screen now (TTY only)
        self._printed_at: float | None = None
        self._shown: Mapping[str, Any] | None = None  # the fields last printed (plain lines)

    def show(self, job: Job) -> None:
        """Take the job's latest progress: redraw the line, or print one when it is time."""
        if not job.progress:
            return
        from .. import render

        if self.tty:
            text = render.progress(job.progress)
            if text != self._text or not self._drawn:
                self._text = text
                self._draw()
            return
        now = self._clock()
        if self._printed_at is None or now - self._printed_at >= self._every:
            self._print(job.progress, now)

    @contextlib.contextmanager
    def above(self) -> Iterator[None]:
        """Print something (log lines) above the live line: erase it, print, draw it again."""
        if self._drawn:
            self.stream.write(ERASE)
            self.stream.flush()
            self._drawn = False
        try:
            yield
        finally:
            if self.tty and self._text:
                self._draw()

    def close(self, job: Job | None = None) -> None:
        """End the live line with the job's last progress (kept on screen), then a newline."""
        from .. import render

        if job is not None and job.progress:
            if self.tty:
                self._text = render.progress(job.progress)
                self._draw()
            else:
                self._print(job.progress, self._clock())
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _draw(self) -> None:
        # A line wider than the terminal wraps, and "\r" then redraws only its last row.
        width = shutil.get_terminal_size((100, 24)).columns - 1
        line = f"gpulayer: {self._text}"
        if len(line) > width:
            line = line[: max(0, width - 1)] + "…"
        self.stream.write(ERASE + line)
        self.stream.flush()
        self._drawn = True

    def _print(self, fields: Mapping[str, Any], now: float) -> None:
        from .. import render

        text = render.progress(fields, self._shown)
        if text and text != self._text:
            self.stream.write(f"gpulayer: progress: {text}\n")
            self.stream.flush()
            self._text, self._shown, self._printed_at = text, fields, now


async def watch(s: Connection, job_id: str, line: LiveLine) -> None:
    """Feed ``line`` with the job's changes from the event stream until the job ends."""
    cursor = await s.event_cursor()
    line.show(await s.get(job_id))
    async for job in job_changes(s, job_id, cursor):
        line.show(job)
        if job.state.terminal:
            return
