"""Secret redaction: every known secret value becomes ``***`` in logs, results and progress.

Used twice (defence in depth): on the worker before a line, a result or a progress report leaves
it, and on the control plane before any of them is stored or served.

Text that arrives in pieces is redacted without gaps. A log line is redacted whole (the worker
buffers up to the newline); a line too long to buffer is cut into pieces only where no secret
straddles the cut, and only once the text after the cut is at least :attr:`Redactor.window`
characters long (the longest secret's length − 1), so a secret that begins before the cut is
always seen entire: :meth:`Redactor.cut`. JSON values (results, progress fields) are redacted
recursively, strings only: :meth:`Redactor.redact_json`.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# Very short values would mask ordinary text everywhere ("1", "ab"); they are not redacted.
MIN_SECRET_LEN = 4


class Redactor:
    """The secret values of one job (worker) or of all (control plane), and how to hide them."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self._values: dict[str, str] = {}
        self._pattern: re.Pattern[str] | None = None
        self.window = 0
        for name, value in (values or {}).items():
            self.add(name, value)

    def add(self, name: str, value: str) -> None:
        """Redact ``value`` from now on (``name`` only keys it: a new value replaces the old)."""
        self._values[name] = value
        candidates = sorted(
            {v for v in self._values.values() if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True
        )
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in candidates)) if candidates else None
        )
        # Characters of text to hold back at a cut: any secret starting before it then ends
        # inside what we can already see.
        self.window = max((len(v) for v in candidates), default=1) - 1

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by :data:`MASK`."""
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)

    def redact_json(self, value: Any) -> Any:
        """A JSON value (result, progress fields) with secrets masked in every string, keys too."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redact_json(v) for v in value]
        if isinstance(value, dict):
            return {self.redact(str(k)): self.redact_json(v) for k, v in value.items()}
        return value

    def cut(self, text: str, limit: int) -> int:
        """Where to cut ``text`` (a line too long to keep whole) so no secret straddles the cut.

        Call it when ``len(text) >= limit + self.window``: every secret that begins before
        ``limit`` then ends inside ``text``. Returns ``limit``, or the start of the secret that
        crosses it (its end, if that secret starts the text): ``redact(text[:n])`` and the rest,
        redacted later with what follows, together hide every secret.
        """
        if self._pattern is None:
            return limit
        for m in self._pattern.finditer(text, 0, limit + self.window):
            if m.start() >= limit:
                break
            if m.end() > limit:
                return m.start() if m.start() > 0 else m.end()
        return limit
