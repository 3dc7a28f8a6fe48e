"""Every limit the control plane enforces on what workers report, in one place (ADR 0003, 0016).

The server's contracts (``LogLine``, ``LogBatch``, ``JobReport``, ``CellReport``,
``ReportBatch``) and the API's body limit are declared from these numbers, and the worker splits
everything it sends to fit them (``worker/fitting.py``): a report, a log batch or a cell's output
is never refused for its size, so output volume never fails work.

What one request may carry:

- :data:`MAX_BODY` bytes of JSON (the API answers 413 ``too_large`` past it);
- :data:`MAX_LINES` log lines in one ``LogBatch``, ``JobReport`` or ``CellReport``;
- :data:`MAX_LINE_CHARS` characters in one log line's text; a worker ships a longer line in
  pieces of :data:`LINE_PIECE` characters (each a line of its own, in order);
- :data:`MAX_BATCH` entries in one ``ReportBatch`` (or ``SubmitBatch``).

What a log keeps (past it, lines are dropped and one line says how many):

- :data:`JOB_LOG_CAP` bytes of text per job (a one-shot job, or a session's lines outside cells);
- :data:`CELL_OUTPUT_CAP` bytes and :data:`CELL_OUTPUT_LINES` lines per session cell.

The worker enforces the caps (nothing floods the network); the control plane enforces them too,
with :data:`SERVER_SLACK` more, so a worker that does not cannot fill its disk.
"""

from __future__ import annotations

from ..display import human_bytes

# Seconds without a heartbeat before a worker is declared lost (its jobs requeued): the default of
# `gpulayer serve --heartbeat-timeout`, the Jupyter extension's and the embedded plane's. Workers
# beat at a third of it, so one lost or slow beat is not a lost worker.
HEARTBEAT_TIMEOUT = 30.0

MAX_BODY = 8 << 20  # bytes of one JSON request body (api/params.py ApiLimits.max_json)
MAX_LINES = 10_000  # log lines in one LogBatch, JobReport or CellReport
# Characters of one line's text the server takes. Generous: workers before this module could
# send a line of up to about twice LINE_PIECE (a read's worth past a piece), and must not be
# refused; this one bounds what a misbehaving worker can make the server hold per line.
MAX_LINE_CHARS = 1 << 20
LINE_PIECE = 64 << 10  # characters of each piece a worker ships a longer line in
MAX_BATCH = 1_000  # entries in one report or submit batch

JOB_LOG_CAP = 64 << 20  # bytes of log text one job keeps
CELL_OUTPUT_CAP = 8 << 20  # bytes of output one session cell keeps
# Lines one cell keeps: a notebook cannot show more usefully, and each is a record to store.
CELL_OUTPUT_LINES = 100_000
# How far past a cap the control plane still stores (the worker's pieces and its own note).
SERVER_SLACK = 1 << 20
SERVER_SLACK_LINES = 1_000

# What a worker keeps in memory for one job's output not yet taken by the control plane: past
# it, reading the job's pipes waits (the job's writes block) until the backlog is sent.
BACKLOG_LINES = 50_000
BACKLOG_BYTES = 16 << 20


def dropped_note(lines: int, size: int, cap: int, what: str) -> str:
    """The one line a capped log gets: how much was dropped, and the cap (``what``: whose log)."""
    return (
        f"[gpulayer] {lines:,} line{'' if lines == 1 else 's'} ({human_bytes(size)}) of output "
        f"dropped: {what} is capped at {human_bytes(cap)}"
    )
