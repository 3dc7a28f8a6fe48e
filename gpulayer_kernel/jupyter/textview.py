"""The text view of a ``%%gpulayer`` cell: a job streamed into the cell as text.

Where widgets cannot render (nbval, nbconvert, a terminal IPython) a cell shows the same
information as the widget, as text: one line when the job is submitted, the pending explanation
while it waits, its log lines as they arrive (``[rank N]`` prefixed for a gang), progress now and
then, and one closing line. Its lines are ``render``'s, as the widget's and the reprs' are.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TextIO

from .. import render, words
from ..contracts import Job, JobState, LogRecord
from ..render import chart_point, curve, log_text, progress, state_line


class JobView(Protocol):
    """What a running cell shows; implemented by ``TextView`` and the widget."""

    def update(self, job: Job) -> None: ...
    def add_logs(self, records: Sequence[LogRecord]) -> None: ...
    def note(self, text: str) -> None: ...
    def finish(self, job: Job) -> None: ...


class TextView:
    """Streams a job into the cell as text: logs as they arrive, state changes as lines.

    Every write is flushed at once: ipykernel otherwise batches stream output for up to 200 ms,
    and a log line should reach the notebook within one round trip of the worker printing it.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self._out = out
        self._err = err
        self._state: JobState | None = None
        self._sentence = ""
        self._progress_at = 0.0
        self._progress = ""
        self._shown: Mapping[str, Any] | None = None  # the progress fields printed last
        self._curves: dict[str, list[float]] = {}  # each charted metric at each new step
        self._curve_step: float | None = None
        self._notes: set[str] = set()  # the job's system lines shown: a reason said once is enough

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    @property
    def err(self) -> TextIO:
        return self._err or sys.stderr

    def _say(self, text: str) -> None:
        self.out.write(f"gpulayer: {words.plain(text)}\n")
        self.out.flush()

    def said_why(self, job: Job) -> bool:
        """Whether the cell already shows why ``job`` ended (its reason, as one of its lines):
        then the closing line and the cell's error need not say it again."""
        return bool(job.reason) and job.reason in self._notes

    def update(self, job: Job) -> None:
        if self._state is None:
            self._say(f"job {job.id} submitted ({job.spec.name})")
        self._state = job.state
        sentence = job.pending.sentence if job.pending is not None else ""
        if job.state == JobState.QUEUED and sentence and sentence != self._sentence:
            self._sentence = sentence
            # The sentence says for each reason whether waiting helps; say it once more only
            # where it does not (no workers at all, a quota).
            helps = job.pending is not None and job.pending.waiting_helps
            said = "waiting helps" in sentence or "waiting won't help" in sentence
            hint = "" if said else ("waiting helps; " if helps else "waiting won't help; ")
            self._say(
                f"waiting: {sentence} ({hint}cancel with %gpulayer cancel {job.id} "
                "or interrupt the kernel)"
            )
        self._note_curve(job.progress)
        now = time.monotonic()
        if job.progress and now - self._progress_at >= render.PROGRESS_EVERY:
            self._show_progress(job.progress)

    def _note_curve(self, fields: Mapping[str, Any] | None) -> None:
        point = chart_point(fields)
        if point is None or point[0] == self._curve_step:
            return
        self._curve_step = point[0]
        for key, value in point[1].items():
            self._curves.setdefault(key, []).append(value)

    def _show_progress(self, fields: Mapping[str, Any]) -> None:
        text = progress(fields, self._shown)
        if text and text != self._progress:
            self._progress, self._progress_at = text, time.monotonic()
            self._shown = fields
            self._say(f"progress: {text}")

    def add_logs(self, records: Sequence[LogRecord]) -> None:
        # stdout and our own notes go to stdout (red stderr blocks are for the job's stderr);
        # consecutive lines for one stream are written at once, in order.
        chunk: list[str] = []
        dest: TextIO | None = None
        for r in records:
            if r.stream == "system":
                self._notes.add(r.text)
            target = self.err if r.stream == "stderr" else self.out
            if target is not dest and chunk:
                self._write(dest, chunk)
            dest = target
            chunk.append(log_text(r) + "\n")
        if chunk:
            self._write(dest, chunk)

    @staticmethod
    def _write(dest: TextIO | None, chunk: list[str]) -> None:
        assert dest is not None
        dest.write("".join(chunk))
        dest.flush()
        chunk.clear()

    def note(self, text: str) -> None:
        self._say(text)

    def finish(self, job: Job) -> None:
        if job.progress:
            self._note_curve(job.progress)
            self._show_progress(job.progress)
        # Text mode's stand-in for the widget's live chart: each curve as one compact line.
        for key, values in self._curves.items():
            if len(values) > 1:
                self._say(f"curve: {curve(key, values)}")
        self._say(state_line(job, reason=not self.said_why(job)))
