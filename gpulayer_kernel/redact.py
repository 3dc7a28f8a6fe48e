"""Secret redaction for log lines: every known secret value becomes ``***``.

Used twice (defence in depth): on the worker before a line leaves it, and on the control plane
before a line is stored. Lines are redacted whole (the worker buffers up to the newline), so a value
written in two pieces is still caught.
"""

from __future__ import annotations

import re

MASK = "***"
# Very short values would mask ordinary text everywhere ("1", "ab"); they are not redacted.
MIN_SECRET_LEN = 4


class Redactor:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self._values: dict[str, str] = {}
        self._pattern: re.Pattern[str] | None = None
        for name, value in (values or {}).items():
            self.add(name, value)

    def add(self, name: str, value: str) -> None:
        self._values[name] = value
        candidates = sorted(
            {v for v in self._values.values() if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True
        )
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in candidates)) if candidates else None
        )

    def redact(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)
