"""What a worker sends, cut to fit the control plane's limits (``contracts/limits.py``).

Three cuts, each keeping order and losing nothing:

- a line over :data:`~gpulayer_kernel.contracts.limits.LINE_PIECE` characters becomes several
  lines (:func:`fit_lines`; a display too large for a request is bounded as ``display.bound``
  bounds one, with its note);
- a list of lines becomes runs that each fit a request (:func:`runs`): at most
  :data:`~gpulayer_kernel.contracts.limits.MAX_LINES` lines and
  :data:`~gpulayer_kernel.contracts.limits.MAX_BODY` bytes, measured on the JSON as it is sent;
- the reporter takes from each attempt's queued lines what fits the batch it is building
  (``worker/reports.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import display
from ..contracts import LogLine
from ..contracts._base import built
from ..contracts.limits import LINE_PIECE, MAX_BODY, MAX_LINES

# Bytes kept free in a request for what surrounds its lines: the envelope of a log batch, or of
# a report entry without its lines (each entry's own is measured: a result can be 1 MiB).
ENVELOPE = 1024


def make_line(
    time: float,
    stream: str,
    text: str,
    rank: int | None = None,
    cell: int | None = None,
    data: dict[str, Any] | None = None,
) -> LogLine:
    """A line built unchecked (``contracts.built``: the worker made every part), at a fifth of
    ``model_construct``'s cost: a chatty job makes a million of them."""
    fields = {"time": time, "stream": stream, "rank": rank, "text": text, "cell": cell}
    return built(LogLine, {**fields, "data": data})


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (what goes on the wire), without encoding ASCII."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def line_json(line: LogLine) -> str:
    """A line as it is sent: unset fields (rank, cell, data) left out, as older servers expect."""
    return line.model_dump_json(exclude_none=True)


def line_size(line: LogLine) -> int:
    """Bytes the line takes in a request's JSON, its separating comma included."""
    return utf8_len(line_json(line)) + 1


def pieces(line: LogLine, size: int = LINE_PIECE) -> list[LogLine]:
    """The line as lines of at most ``size`` characters each (a display: whole, bounded)."""
    if line.data is not None:
        if utf8_len(line_json(line)) <= MAX_BODY // 2:
            return [line]
        # A display past what one request carries (GPULAYER_MAX_DISPLAY_BYTES set that high):
        # bounded as the session host bounds one, its note saying what was dropped.
        data = display.bound(dict(line.data), MAX_BODY // 4)
        return [line.model_copy(update={"data": data, "text": display.text_of(data)[:size]})]
    text = line.text
    if len(text) <= size:
        return [line]
    return [line.model_copy(update={"text": text[i : i + size]}) for i in range(0, len(text), size)]


def fit_lines(lines: Sequence[LogLine], size: int = LINE_PIECE) -> list[LogLine]:
    """Every line cut to at most ``size`` characters (:func:`pieces`), in order."""
    if all(ln.data is None and len(ln.text) <= size for ln in lines):
        return list(lines)
    return [p for ln in lines for p in pieces(ln, size)]


def runs(
    sizes: Sequence[int], max_bytes: int = MAX_BODY - ENVELOPE, max_items: int = MAX_LINES
) -> list[range]:
    """Consecutive runs of items, each at most ``max_items`` items of ``max_bytes`` in all.

    An item larger than ``max_bytes`` on its own gets a run of its own (the control plane then
    answers for it alone); :func:`fit_lines` makes sure no line is.
    """
    out: list[range] = []
    start, total = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (total + n > max_bytes or i - start >= max_items):
            out.append(range(start, i))
            start, total = i, 0
        total += n
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out
