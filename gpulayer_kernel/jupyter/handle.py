"""``JobHandle``: a submitted job as seen from the kernel, and following one into a cell.

``%%gpulayer --no-wait`` returns a handle at once (``--handle NAME`` also binds it); a blocking
cell keeps its handle in ``gpulayer_kernel.jupyter.last_job()``. A handle is a thin view on the
control plane: every property asks it again, nothing is cached but the id.

``follow`` drives a view (text or widget) from the bridge's updates until the job ends. Ctrl-C or
"interrupt kernel" while it follows cancels the job, keeps showing what the job prints while it
stops, and waits (up to ``STOP_WAIT`` s) until the worker has stopped its process group.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import render
from ..artifacts import find_artifact
from ..contracts import Artifact, Job, JobState
from ..errors import GPUlayerError
from ..words import plain
from . import textview
from .bridge import Bridge, Update

if TYPE_CHECKING:
    from IPython.lib.pretty import PrettyPrinter

STOP_WAIT = 30.0  # the worker's kill grace is 5 s; a gang's torchrun needs a little more


class CellError(GPUlayerError):
    """A cell-level failure shown as one clean message (IPython calls ``_render_traceback_``)."""

    code = "cell_error"
    status = 400

    def _render_traceback_(self) -> list[str]:
        lines = [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {plain(self.message)}"]
        if self.hint:
            lines.append(f"hint: {plain(self.hint)}")
        return lines


class JobFailed(CellError):
    """The job failed or its worker was lost; its logs say why."""

    code = "job_failed"


class JobCancelled(CellError):
    code = "job_cancelled"


class NoResult(CellError):
    """``--out`` was given but the cell produced no value."""

    code = "no_result"


class CellInterrupted(KeyboardInterrupt):
    """The kernel was interrupted while a cell waited; its job was cancelled."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {self.message}"]


class LogText(str):
    """Log text that prints as lines in a notebook (not as an escaped string)."""

    __slots__ = ()

    def _repr_pretty_(self, p: PrettyPrinter, cycle: bool) -> None:
        p.text(str(self) if self else "(no log lines)")  # type: ignore[no-untyped-call]


class JobHandle:
    """A submitted job: ``result()``, ``wait()``, ``logs()``, ``cancel()``, ``job``, artifacts."""

    def __init__(self, bridge: Bridge, job: Job, widget: Any = None) -> None:
        self._bridge = bridge
        self.id = job.id
        self.name = job.spec.name
        self._last = job
        self.widget = widget  # the live widget when one shows this job

    # -- state -----------------------------------------------------------------------------------

    @property
    def job(self) -> Job:
        """The job as the control plane knows it now (state, placement, pending, progress...)."""
        self._last = self._bridge.get(self.id)
        return self._last

    @property
    def state(self) -> JobState:
        return self.job.state

    @property
    def done(self) -> bool:
        return self.job.state.terminal

    def explain(self) -> str:
        """Why the job waits, or why it went where it went (one sentence)."""
        return self._bridge.explain(self.id)

    # -- waiting and results -----------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> Job:
        """Wait until the job ends (or ``timeout`` s pass) and return it.

        Interrupting this wait stops waiting; it does not cancel the job (``cancel()`` does).
        """
        self._last = self._bridge.wait(self.id, timeout)
        return self._last

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job and return its JSON result; raises if it failed or was cancelled."""
        job = self.wait(timeout)
        if not job.state.terminal:
            raise TimeoutError(f"job {self.id} is still {job.state.value} after {timeout:g}s")
        return result_of(job)

    def follow(self, view: textview.JobView | None = None) -> Job:
        """Show the job's logs and state in this cell until it ends (Ctrl-C stops following)."""
        shown: textview.JobView = textview.TextView() if view is None else view
        return follow(self._bridge, self.id, shown, cancel_on_interrupt=False)

    def logs(self) -> LogText:
        """Every log line so far, as text (``[rank N]`` prefixed in a gang)."""
        return LogText(render.logs(self._bridge.all_logs(self.id)))

    def cancel(self, wait: bool = True, timeout: float = STOP_WAIT) -> Job:
        """Cancel the job; with ``wait``, return once its processes are stopped."""
        job = self._bridge.cancel(self.id)
        if wait and not job.state.terminal:
            job = self._bridge.wait(self.id, timeout)
        self._last = job
        return job

    # -- artifacts -------------------------------------------------------------------------------

    @property
    def artifacts(self) -> list[Artifact]:
        """Files the job wrote to ``$GPULAYER_OUTPUT`` (kept by the control plane)."""
        return list(self.job.artifacts)

    def read_artifact(self, name: str) -> bytes:
        """The content of one artifact (by name; a gang's ``rank0/x`` also answers to ``x``)."""
        return self._bridge.get_blob(find_artifact(self.job, name).digest)

    def download(self, name: str, dest: str | Path | None = None) -> Path:
        """Save one artifact to ``dest`` (default: its own name in the current directory)."""
        data = self.read_artifact(name)
        path = Path(dest) if dest is not None else Path(name)
        if path.is_dir():
            path = path / Path(name).name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    # -- display ---------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<JobHandle {self.id} ({self.name}) {self._last.state.value}>"

    def _repr_pretty_(self, p: PrettyPrinter, cycle: bool) -> None:
        try:
            job = self.job
        except GPUlayerError:
            job = self._last
        p.text(render.summary(job))  # type: ignore[no-untyped-call]

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # With a live widget, the handle shows as that widget (where widgets render).
        if self.widget is None:
            return None
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        if not isinstance(data, dict):
            return None
        try:
            data = {**data, "text/plain": render.summary(self.job)}
        except GPUlayerError:
            pass
        return data, meta


def result_of(job: Job, *, said_why: bool = False) -> Any:
    """A finished job's result, or the error that says why there is none (``said_why``: the
    cell already shows the reason, so the error points at it rather than repeating it)."""
    if job.state == JobState.SUCCEEDED:
        return job.result
    why = ""
    if job.reason:
        why = " (why: above)" if said_why else f": {job.reason}"
    if job.state == JobState.CANCELLED:
        raise JobCancelled(f"job {job.id} was cancelled{why}")
    # A job that never started (it can never run here, a secret is missing) printed nothing:
    # its reason is the whole story, and there is no log or traceback to point at.
    ran = job.started_at is not None
    raise JobFailed(
        f"job {job.id} {job.state.value}{why}",
        hint="its output above (or handle.logs()) shows how it ended" if ran else "",
    )


def follow(
    bridge: Bridge,
    job_id: str,
    view: textview.JobView,
    *,
    cancel_on_interrupt: bool = True,
) -> Job:
    """Feed ``view`` with the job's updates until it ends; returns the final Job.

    Runs on the kernel's main thread; the updates come from the bridge thread through a queue.
    """
    updates: queue.Queue[Update] = queue.Queue()
    watch = bridge.watch(job_id, updates.put)
    try:
        job = _drain(updates, view, None)
        assert job is not None
        return job
    except KeyboardInterrupt:
        if not cancel_on_interrupt:
            view.note(f"stopped following job {job_id}; it goes on (cancel it with .cancel())")
            raise
        view.note(f"interrupted: cancelling job {job_id} and waiting for its processes to stop")
        try:
            bridge.cancel(job_id, reason="cancelled: the kernel was interrupted")
            final = _drain(updates, view, time.monotonic() + STOP_WAIT)
            state = final.state.value if final is not None else "still stopping"
            msg = f"job {job_id} {state}: the kernel was interrupted"
        except KeyboardInterrupt:
            msg = f"job {job_id} is being cancelled (stopped waiting for it)"
        raise CellInterrupted(msg) from None
    finally:
        watch.stop()


def _drain(
    updates: queue.Queue[Update], view: textview.JobView, deadline: float | None
) -> Job | None:
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        try:
            # A timeout keeps the wait interruptible everywhere (and bounded by ``deadline``).
            u = updates.get(timeout=1.0 if left is None else min(1.0, left))
        except queue.Empty:
            continue
        if u.kind == "job" and u.job is not None:
            view.update(u.job)
        elif u.kind == "logs":
            view.add_logs(u.records)
        elif u.kind == "done" and u.job is not None:
            view.update(u.job)
            view.finish(u.job)
            return u.job
        elif u.kind == "error":
            err = u.error
            if isinstance(err, GPUlayerError):
                raise err
            raise GPUlayerError(f"following the job failed: {err!r}") from err
