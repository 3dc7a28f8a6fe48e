"""The job widget (anywidget): state, placement, pending reason, progress, live chart, logs, cancel.

Python keeps the facts in synced traits, already rendered to text by ``render`` (so a placement or
a progress line reads the same in the widget, the text view and the reprs); ``widget.js`` only lays
them out. ``widget.js`` is built from ``labextension/src/widget/`` (TypeScript, with the panel's
duration format and requester) by ``jlpm build:widget``; ``tests/test_labextension.py`` checks that
the file here is what the sources build. Log lines travel as custom messages (appends, not a
resent list) and the last ``TAIL`` lines are also kept in ``log_tail`` so a saved notebook or a
reloaded page shows them.

Cancelling while the cell blocks: the kernel runs the cell, so it cannot read the button's comm
message until the cell ends. The button therefore talks to the Jupyter server from the page:

* a served control plane (the GPUlayer server extension hosts one in the Jupyter server) → ``POST
  {base}gpulayer/api/v1/jobs/{id}/cancel`` through the panel's requester (the page's XSRF cookie);
  the cell sees the job cancelled and ends with ``JobCancelled``;
* an embedded control plane (in the kernel), or when that route answers 404 → ``POST
  {base}api/kernels/{id}/interrupt``: the magic gets ``KeyboardInterrupt``, cancels the job and
  waits for its processes to stop;
* after the cell returned (``--no-wait``) the kernel is idle: a comm message, then
  ``handle.cancel()`` in Python.

Where the page has no Jupyter server (VS Code, static HTML), the button says to interrupt the
kernel instead.

The live chart: each progress report with a new ``step`` becomes a point of the loss and the other
metrics (``render.chart_point``), sent as a custom message (appends, like log lines) and kept, the
last ``CHART_POINTS``, in ``chart`` for a saved notebook. uPlot (MIT, ~50 kB, vendored in
``vendor/``) draws it; it is put in front of the widget's ESM, so no CDN and no network is needed.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from .. import render
from ..contracts import Job, JobState, LogRecord
from .bridge import Update

if TYPE_CHECKING:
    from .bridge import Bridge

TAIL = 2000  # log lines kept in the saved widget state
CHART_POINTS = 2000  # chart points kept in the saved widget state (the page keeps 5000)
_HERE = Path(__file__).parent


def _esm() -> str:
    """uPlot's browser build (it defines ``uPlot`` in the module's scope) + the widget."""
    vendor = (_HERE / "vendor" / "uPlot.iife.min.js").read_text()
    return vendor + "\n" + (_HERE / "widget.js").read_text()


def _css() -> str:
    return (
        (_HERE / "vendor" / "uPlot.min.css").read_text() + "\n" + (_HERE / "widget.css").read_text()
    )


def kernel_id() -> str:
    """This kernel's id (from its connection file name), or "" outside a Jupyter kernel."""
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).name
    except Exception:
        return ""
    if name.startswith("kernel-") and name.endswith(".json"):
        return name[len("kernel-") : -len(".json")]
    return ""


def rest_cancel_path(bridge: Bridge, job_id: str) -> str:
    """The cancel route to try first, relative to the API the page's Jupyter server mounts, or
    "" when it cannot be this job's.

    A served control plane may be the one the page's Jupyter server hosts (the extension mounts
    the API under ``{base}gpulayer/api/v1``). The page tries it; a 404 (no extension there, or
    another control plane that does not know this job) makes it interrupt the kernel instead.
    An embedded control plane lives in this kernel: no server can reach it.
    """
    return "" if bridge.embedded else f"jobs/{job_id}/cancel"


class JobWidget(anywidget.AnyWidget):
    """One job, live. Implements ``textview.JobView``."""

    _esm = _esm()
    _css = _css()

    job_id = traitlets.Unicode("").tag(sync=True)
    name = traitlets.Unicode("").tag(sync=True)
    state = traitlets.Unicode("queued").tag(sync=True)
    terminal = traitlets.Bool(False).tag(sync=True)
    placement = traitlets.Unicode("").tag(sync=True)
    simulated = traitlets.Bool(False).tag(sync=True)
    pending = traitlets.Unicode("").tag(sync=True)
    waiting_helps = traitlets.Bool(True).tag(sync=True)
    progress = traitlets.Float(-1.0).tag(sync=True)  # 0..1, or -1 without step/total
    progress_text = traitlets.Unicode("").tag(sync=True)
    elapsed = traitlets.Float(-1.0).tag(sync=True)  # seconds as of this update; -1: not started
    running = traitlets.Bool(False).tag(sync=True)
    ranks = traitlets.Int(1).tag(sync=True)
    outcome = traitlets.Unicode("").tag(sync=True)
    log_tail = traitlets.List(traitlets.List()).tag(sync=True)
    blocking = traitlets.Bool(False).tag(sync=True)
    cancel_path = traitlets.Unicode("").tag(sync=True)  # under the API's path (rest_cancel_path)
    kernel_id = traitlets.Unicode("").tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    chart = traitlets.List(traitlets.List()).tag(sync=True)  # [[step, {metric: value}], ...]
    cost = traitlets.Unicode("").tag(sync=True)  # charged, ≈ estimated (render.cost)
    attempts = traitlets.List(traitlets.Unicode()).tag(sync=True)  # render.attempt_lines

    def __init__(self, bridge: Bridge, job: Job, *, blocking: bool, **kwargs: Any) -> None:
        super().__init__(
            job_id=job.id,
            name=job.spec.name,
            blocking=blocking,
            cancel_path=rest_cancel_path(bridge, job.id),
            kernel_id=kernel_id(),
            **kwargs,
        )
        self._bridge = bridge
        self._tail: collections.deque[list[Any]] = collections.deque(maxlen=TAIL)
        self._points: collections.deque[list[Any]] = collections.deque(maxlen=CHART_POINTS)
        self.on_msg(self._on_msg)
        self.update(job)

    # -- JobView ---------------------------------------------------------------------------------

    def update(self, job: Job) -> None:
        took = render.elapsed(job)
        pending = job.pending if job.state == JobState.QUEUED else None
        with self.hold_sync():
            self.state = job.state.value
            self.terminal = job.state.terminal
            self.placement = render.placement(job) if job.placement is not None else ""
            self.simulated = bool(job.placement and any(n.simulated for n in job.placement.nodes))
            self.pending = pending.sentence if pending is not None else ""
            self.waiting_helps = pending.waiting_helps if pending is not None else True
            self.progress = _fraction(job.progress)
            self.progress_text = render.progress(job.progress)
            self.elapsed = -1.0 if took is None else took
            self.running = job.state == JobState.RUNNING
            self.ranks = render.ranks(job)
            self.cost = render.cost(job)
            # One attempt says nothing the rest does not; a retried job lists them all.
            self.attempts = render.attempt_lines(job) if len(job.history) > 1 else []
        self._chart(job.progress)

    def _chart(self, fields: dict[str, Any] | None) -> None:
        point = render.chart_point(fields)
        if point is None or (self._points and self._points[-1][0] == point[0]):
            return
        entry = [point[0], point[1]]
        self._points.append(entry)
        self.send({"type": "points", "points": [entry]})

    def add_logs(self, records: Sequence[LogRecord]) -> None:
        # A progress bar's redraws (``\r``) arrive as one line: show its last state, as a
        # terminal would (render.visible), not every redraw run together.
        lines = [[r.stream, r.rank, render.visible(r.text)] for r in records]
        self._tail.extend(lines)
        self.send({"type": "logs", "lines": lines})

    def note(self, text: str) -> None:
        self.message = text

    def finish(self, job: Job) -> None:
        self.update(job)
        with self.hold_sync():
            self.blocking = False
            self.log_tail = list(self._tail)
            self.chart = list(self._points)
            self.outcome = render.state_line(job)

    def feed(self, u: Update) -> None:
        """Apply one bridge update (``--no-wait``: called on the bridge thread)."""
        if u.kind == "job" and u.job is not None:
            self.update(u.job)
        elif u.kind == "logs":
            self.add_logs(u.records)
        elif u.kind == "done" and u.job is not None:
            self.finish(u.job)
        elif u.kind == "error":
            self.note(f"stopped following the job: {u.error}")

    # -- the cancel button, when the kernel is idle ------------------------------------------------

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "cancel" and not self.terminal:
            try:
                job = self._bridge.cancel(self.job_id, reason="cancelled from the widget")
            except Exception as exc:
                self.message = f"cancel failed: {exc}"
                return
            self.message = "cancel requested; stopping its processes"
            self.update(job)

    def __repr__(self) -> str:
        return f"JobWidget(job {self.job_id} {self.state})"


def _fraction(fields: dict[str, Any] | None) -> float:
    if not fields:
        return -1.0
    step, total = fields.get("step"), fields.get("total")
    if not isinstance(step, (int, float)) or not isinstance(total, (int, float)):
        return -1.0
    if isinstance(step, bool) or isinstance(total, bool) or total <= 0:
        return -1.0
    return max(0.0, min(1.0, step / total))
