"""Plain-text rendering of jobs, logs and workers: the lines and tables the CLI, the reprs, the
widget and a cell's text view (``jupyter/textview.py``) share, so a placement or a progress line
reads the same everywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import display, words
from .contracts import (
    CellRun,
    Job,
    JobState,
    LogRecord,
    SessionInfo,
    SessionStatus,
    WorkerInfo,
)
from .contracts.workers import HIDDEN_JOB

PROGRESS_EVERY = 2.0  # seconds between two printed progress lines: a log, not a progress bar


def duration(seconds: float) -> str:
    """``4s``, ``3m 05s``, ``2h 10m``, ``3d 4h``: the Lab panel's ``formatDuration`` and the cell
    widget's, word for word (``labextension/test/durations.json`` is the examples all three
    are tested against)."""
    if not math.isfinite(seconds):
        return "–"
    s = max(0, math.floor(seconds))
    if s < 60:
        return f"{s}s"
    m = s // 60
    if m < 60:
        return f"{m}m {s % 60:02d}s"
    h = m // 60
    if h < 24:
        return f"{h}h {m % 60:02d}m"
    return f"{h // 24}d {h % 24}h"


def elapsed(job: Job, now: float | None = None) -> float | None:
    """Seconds the job has run (or ran); None before it started."""
    if job.started_at is None:
        return None
    end = job.finished_at if job.finished_at is not None else (now or time.time())
    return max(0.0, end - job.started_at)


def ranks(job: Job) -> int:
    """How many ranks (processes) the job runs as: one per placed device of a gang (a GPU
    kernel is one process that sees all its GPUs)."""
    if job.placement is None or not _ranked(job):
        return 1
    return sum(max(1, len(n.devices)) for n in job.placement.nodes if not n.cpu_fallback) or 1


def _ranked(job: Job) -> bool:
    return job.spec.is_gang and not getattr(job.spec.workload, "kernel", False)


def placement(job: Job) -> str:
    """``local-vm GPUs 0,1 (simulated) · ranks 0-1``, ``local-vm on CPU (fallback)`` or ``-``."""
    if job.placement is None:
        return "-"
    parts = []
    base = 0
    for n in job.placement.nodes:
        if n.cpu_fallback:
            parts.append(f"{n.worker_name} on CPU (fallback)")
            continue
        if not n.devices:
            parts.append(f"{n.worker_name} (CPU)")
            continue
        where = f"{n.worker_name} GPU{'s' if len(n.devices) > 1 else ''} "
        where += ",".join(map(str, n.devices))
        if n.simulated:
            where += " (simulated)"
        if _ranked(job):
            last = base + len(n.devices) - 1
            where += f" · rank{'s' if last > base else ''} {base}" + (
                f"-{last}" if last > base else ""
            )
            base = last + 1
        parts.append(where)
    return "; ".join(parts)


def number(value: float | int) -> str:
    """A number for people: ``41,230``, ``0.4123``, ``3.00e-04``, ``1.2e+09``."""
    if isinstance(value, int):
        return f"{value:,}"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}" if magnitude < 1e12 else f"{value:.3g}"
    if magnitude != 0 and magnitude < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def _field(key: str, value: Any) -> str | None:
    """One progress field as words; None for what carries nothing (a missing value)."""
    if value is None:
        return None  # e.g. mfu on a CPU: unknown is not worth a column
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} {value}"
    if key == "samples_per_s":
        return f"{value:,.0f} samples/s"
    if key.endswith("_per_s"):
        return f"{value:,.0f} {key.removesuffix('_per_s')}/s"
    if key == "mfu":
        return f"mfu {value:.1%}"
    if key == "lr":
        return f"lr {value:.2e}"
    return f"{key} {number(value)}"


def progress(fields: Mapping[str, Any] | None, previous: Mapping[str, Any] | None = None) -> str:
    """``step 30/100 (30%) · loss 0.412 · 41,230 samples/s``; empty without progress.

    With ``previous`` (the fields shown last time) validation figures (``val_*``) that did not
    change are left out: a Trainer validates now and then, and repeats its last ``val_loss`` in
    every report until the next validation, which reads as news each time when it is not.
    """
    if not fields:
        return ""
    out = []
    step, total = fields.get("step"), fields.get("total")
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
            out.append(f"step {number(step)}/{number(total)} ({100 * step / total:.0f}%)")
        else:
            out.append(f"step {number(step)}")
    for key, value in fields.items():
        if key in ("step", "total"):
            continue
        if previous is not None and key.startswith("val_") and previous.get(key) == value:
            continue
        text = _field(key, value)
        if text is not None:
            out.append(text)
    return " · ".join(out)


#: progress fields that are bookkeeping, not curves: never charted (widget) or summarised (text)
NOT_CHARTED = frozenset({"step", "total", "epoch", "samples_per_s", "mfu", "lr"})
SPARK = "▁▂▃▄▅▆▇█"


def chart_point(fields: Mapping[str, Any] | None) -> tuple[float, dict[str, float]] | None:
    """``(step, {metric: value})`` of a progress report, for the live chart; None: nothing to draw.

    Metrics are the finite numbers among the fields but bookkeeping (:data:`NOT_CHARTED`,
    ``*_per_s``); without a ``step`` there is no x to draw at.
    """
    if not fields:
        return None
    step = fields.get("step")
    if not isinstance(step, (int, float)) or isinstance(step, bool):
        return None
    values = {
        key: float(value)
        for key, value in fields.items()
        if key not in NOT_CHARTED
        and not key.endswith("_per_s")
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
        and value not in (float("inf"), float("-inf"))
    }
    return (float(step), values) if values else None


def curve(name: str, values: Sequence[float], width: int = 24) -> str:
    """``loss 2.301 → 0.4123 (min 0.3988, max 2.301) █▆▅▃▂▂▁``: a metric's curve as one line.

    The sparkline is on a log scale when the values are positive and span more than a decade
    (a loss falling from 2.3 to 0.02 would read as one bar and a flat line otherwise).
    """
    picked = list(values)
    if len(values) > width:
        picked = [values[round(i * (len(values) - 1) / (width - 1))] for i in range(width)]
    low, high = min(values), max(values)
    scaled = picked
    if low > 0 and high / low > 10:
        scaled, low, high = [math.log(v) for v in picked], math.log(low), math.log(high)
    span = (high - low) or 1.0
    spark = "".join(SPARK[min(7, int((v - low) / span * 7.999))] for v in scaled)
    first, last = number(values[0]), number(values[-1])
    return f"{name} {first} → {last} (min {number(min(values))}, max {number(max(values))}) {spark}"


def state_line(job: Job, now: float | None = None, *, reason: bool = True) -> str:
    """One line: ``job 3f2a1b2c3d4e (cell) running on local-vm GPUs 0,1 (simulated), 3.21s``;
    a job that did not succeed says why, unless ``reason`` is False (the cell said it already)."""
    text = f"job {job.id} ({job.spec.name}) {job.state.value}"
    if job.placement is not None and job.state in (JobState.PLACED, JobState.RUNNING):
        text += f" on {placement(job)}"
    took = elapsed(job, now)
    if took is not None:
        text += f" {'in' if job.state.terminal else 'for'} {duration(took)}"
    if reason and job.state.terminal and job.state != JobState.SUCCEEDED and job.reason:
        text += f": {job.reason}"
    return text


def dollars(amount: float) -> str:
    """``$0.00``, ``$1.25``, ``$1,204`` (never ``$-0.00``)."""
    return words.dollars(amount, short=True)


def cost(job: Job) -> str:
    """What the job cost (charges of its ended attempts) and is expected to (``≈`` the estimate
    of the one placed or running): ``$0.85 + ≈ $4.20``; empty before it was first placed."""
    if not job.history:
        return ""
    charged = sum(a.charge or 0.0 for a in job.history)
    open_ = next((a for a in job.history if a.charge is None), None)
    if open_ is None:
        return dollars(charged)
    if charged:
        return f"{dollars(charged)} + ≈ {dollars(open_.estimate)}"
    return f"≈ {dollars(open_.estimate)}"


def attempt_lines(job: Job) -> list[str]:
    """One line per attempt: ``attempt 0 on fake-1c2d (fake): preempted (…), $0.12 of ≈ $4.20,
    retried``."""
    out = []
    for a in job.history:
        where = ", ".join(a.workers) + (f" ({a.provider})" if a.provider else "")
        how = f"{a.outcome}" + (f" ({a.reason})" if a.reason else "") if a.outcome else "running"
        money = (
            f"{dollars(a.charge)} of ≈ {dollars(a.estimate)}"
            if a.charge is not None
            else f"≈ {dollars(a.estimate)}"
        )
        out.append(
            f"attempt {a.attempt} on {where}: {how}, {money}" + (", retried" if a.retried else "")
        )
    return out


def summary(job: Job, now: float | None = None) -> str:
    """A few lines for reprs and ``%gpulayer`` answers: state, placement, why, progress, outputs."""
    lines = [state_line(job, now)]
    if job.state == JobState.QUEUED and job.pending is not None and job.pending.sentence:
        lines.append(f"  waiting: {job.pending.sentence}")
    if job.placement is not None:
        lines.append(f"  placement: {placement(job)}")
    if job.history:
        lines.append(f"  cost: {cost(job)}")
    if len(job.history) > 1:
        lines.extend(f"  {line}" for line in attempt_lines(job))
    text = progress(job.progress)
    if text:
        lines.append(f"  progress: {text}")
    if job.state == JobState.SUCCEEDED and job.result is not None:
        shown = repr(job.result)
        lines.append(f"  result: {shown if len(shown) <= 200 else shown[:197] + '...'}")
    for a in job.artifacts:
        lines.append(f"  artifact: {a.name} ({size(a.size)})")
    return words.plain("\n".join(lines))


def visible(text: str) -> str:
    """What a terminal shows of a line written with carriage returns: its last redraw.

    Progress bars (tqdm, pip, curl) redraw one line with ``\\r``; the worker ships the line
    when its newline comes, with every redraw in it (``\\r 1/20\\r 2/20…``). Shown raw that
    reads ``1/202/20…``; the last non-empty redraw is what the user saw in a terminal.
    """
    if "\r" not in text:
        return text
    for part in reversed(text.split("\r")):
        if part:
            return part
    return ""


def log_text(record: LogRecord) -> str:
    """A log line as shown in a cell: ``[rank 1] text`` for a rank, ``gpulayer: ...`` for ours."""
    prefix = f"[rank {record.rank}] " if record.rank is not None else ""
    text = visible(record.text)
    if record.stream == "system":  # our words: plain text, no `code` marks, "gpulayer" once
        return f"gpulayer: {prefix}{words.plain(text.removeprefix('[gpulayer] '))}"
    return f"{prefix}{text}"


def logs(records: Iterable[LogRecord]) -> str:
    return "\n".join(log_text(r) for r in records)


def age(t: float | None, now: float | None = None) -> str:
    if t is None:
        return "-"
    d = max(0.0, (now or time.time()) - t)
    if d < 60:
        return f"{d:.0f}s ago"
    if d < 3600:
        return f"{d / 60:.0f}m ago"
    return f"{d / 3600:.1f}h ago"


def session_line(info: SessionInfo, now: float | None = None) -> str:
    """One line for a session: name, status, where, ranks, cells, when it ends if idle, holder."""
    where = placement(info.job) if info.job.placement is not None else "not placed yet"
    # A GPU kernel is one process and takes no session cells (its notebook's cells are its).
    ranks = "GPU kernel" if info.kernel else words.count(info.ranks, "rank")
    idle = ""
    if info.status == SessionStatus.IDLE and info.ends_at is not None:
        left = max(0.0, info.ends_at - (now or time.time()))
        idle = f", idle (ends in {duration(left)} unless a cell runs)"
    cells = "" if info.kernel else f", {words.count(info.cells, 'cell')}"
    why = f" — {info.reason}" if info.reason else ""
    ws = info.workspace
    folder = f", {workspace_words(ws.mode)} {ws.folder}" if ws is not None and ws.folder else ""
    return (
        f"{info.name} [{info.status.value}] {where}, {ranks}{cells}{idle}{folder}, "
        f"held by {info.holder.label}{why}"
    )


def workspace_words(mode: str) -> str:
    """How a session's folder is made, in the words the panel uses too (ADR 0022)."""
    return {"in_place": "in place", "synced": "synced", "none": "no workspace for"}[mode]


def cell_line(cell: CellRun) -> str:
    """``[12] ok 0.031s  42``: a session cell's number, end, duration and what it showed."""
    took = f" {cell.duration:.3f}s" if cell.duration is not None else ""
    return f"[{cell.number}] {cell.state.value}{took} {cell.summary}".rstrip()


def jobs_table(jobs: Sequence[Job], now: float | None = None) -> str:
    if not jobs:
        return "no jobs yet; run a cell with %%gpulayer, or: gpulayer run -- COMMAND"
    rows = [f"{'ID':<13}{'NAME':<20}{'STATE':<11}{'EXIT':<6}{'SUBMITTED':<11}PLACEMENT"]
    for j in jobs:
        code = "-" if j.exit_code is None else str(j.exit_code)
        rows.append(
            f"{j.id:<13}{j.spec.name[:19]:<20}{j.state.value:<11}{code:<6}"
            f"{age(j.submitted_at, now):<11}{placement(j)}"
        )
    return "\n".join(rows)


def size(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``12.3 MiB``, ``2.0 GiB``."""
    return display.human_bytes(n)


def artifacts_table(job: Job) -> str:
    """A job's artifacts, one per line: name, size and digest prefix (``gpulayer artifacts``)."""
    if not job.artifacts:
        return (
            f"job {job.id} has no artifacts (a job's artifacts are the files it writes to "
            "$GPULAYER_OUTPUT)"
        )
    width = max(4, *(len(a.name) for a in job.artifacts)) + 2
    rows = [f"{'NAME':<{width}}{'SIZE':>10}  DIGEST"]
    for a in job.artifacts:
        rows.append(f"{a.name:<{width}}{size(a.size):>10}  {a.digest[:12]}")
    return "\n".join(rows)


def workers_table(workers: Sequence[WorkerInfo], now: float | None = None) -> str:
    if not workers:
        return "no workers; start one with: gpulayer worker --server URL --join-token TOKEN"
    lines = []
    for w in workers:
        sim = " (simulated GPUs)" if w.capabilities.simulated else ""
        gpus = len(w.capabilities.devices)
        what = f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "no GPUs"
        lines.append(
            f"{w.name}  {w.state.value}  {what}{sim}  heartbeat {age(w.last_heartbeat, now)}"
        )
        for mark, why in (("unschedulable", w.unschedulable), ("suspect", w.suspect)):
            if why:  # no new work goes to it; say why (issue 12, items 1 and 9)
                lines.append(f"  {mark}: {why}")
        for d in w.capabilities.devices:
            user = w.device_jobs.get(d.index)
            mem = f"{d.memory_bytes / 2**30:.0f} GiB" if d.memory_bytes else "?"
            tag = " [simulated]" if d.simulated else ""
            held = "free" if not user else f"job {user}"
            if user == HIDDEN_JOB:
                held = "busy (another user's job)"
            lines.append(f"  gpu {d.index}: {d.kind} {mem}{tag}  {held}")
    return "\n".join(lines)
