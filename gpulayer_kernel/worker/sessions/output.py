"""A session rank's output as the worker ships it (ADR 0019): the items of its frames become
log lines — text split at newlines (an unfinished line waits for its end, or for the cell's),
displays whole — and its ``done`` frame becomes its ``RankOutcome``, redacted.
"""

from __future__ import annotations

from typing import Any

from ... import display
from ...contracts import CellError, LogLine, RankOutcome
from ...redact import Redactor
from ..logship import LogShipper


class RankOutput:
    """Turns every rank's frames into lines and outcomes, keeping each unfinished line."""

    def __init__(self, shipper: LogShipper, redactor: Redactor) -> None:
        self.shipper = shipper
        self.redactor = redactor
        self._partial: dict[tuple[int, str], str] = {}  # (rank, stream) -> text without "\n"

    def outcome(self, rank: int, f: dict[str, Any]) -> RankOutcome:
        """A rank's ``done`` frame as its outcome (its error and value redacted)."""
        status = f.get("status", "aborted")
        error = f.get("error")
        redact = self.redactor.redact
        value = f.get("value")
        return RankOutcome(
            rank=rank,
            status=status if status in ("ok", "error") else "aborted",
            error=None
            if not error
            else CellError(
                ename=str(error.get("ename", "Error"))[:500],
                evalue=redact(str(error.get("evalue", "")))[:20_000],
                traceback=[redact(str(t)) for t in error.get("traceback") or []][-2_000:],
                rank=rank,
            ),
            value=display.redact(value, redact) if isinstance(value, dict) else None,
            duration=float(f.get("duration") or 0.0),
        )

    def lines(self, rank: int, n: int, items: list[Any]) -> list[LogLine]:
        """A rank's output items as log lines: text split at newlines, displays whole."""
        out: list[LogLine] = []
        for kind, payload in items:
            if kind == "display" and isinstance(payload, dict):
                out += self.flush(rank, n)
                out.append(self.shipper.line("display", display.text_of(payload), rank, n, payload))
                continue
            if kind not in ("stdout", "stderr"):
                continue
            key = (rank, kind)
            text = self._partial.pop(key, "") + str(payload)
            *whole, rest = text.split("\n")
            out += [self.shipper.line(kind, t, rank, n) for t in whole]
            if rest:
                self._partial[key] = rest
        return out

    def flush(self, rank: int, n: int) -> list[LogLine]:
        """The rank's unfinished lines, as lines: at the cell's end, or before a display."""
        out = []
        for kind in ("stdout", "stderr"):
            rest = self._partial.pop((rank, kind), "")
            if rest:
                out.append(self.shipper.line(kind, rest, rank, n))
        return out
