"""Token lifetimes as people write them (``--ttl 30m``): parsed and bounded, or refused."""

from __future__ import annotations

import re

from ..errors import InvalidInput

_TTL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_TTL = 10 * 365 * 86400.0


def parse_ttl(text: str | None) -> float | None:
    """``"1h"``, ``"30m"``, ``"7d"``, ``"90"`` (seconds) → seconds; ``None``/``"never"`` → None."""
    if text is None or text.strip().lower() in ("", "never", "none"):
        return None
    m = _TTL_RE.match(text.lower())
    if not m:
        raise InvalidInput(
            f"--ttl {text!r} is not a duration",
            hint='write it as seconds or with a unit: "90", "30m", "1h", "7d", "2w"',
            details={"ttl": text},
        )
    seconds = float(m.group(1)) * _TTL_UNITS[m.group(2)]
    if not 0 < seconds <= MAX_TTL:
        raise InvalidInput(
            f"--ttl {text!r} is out of range", hint="use a duration between 1s and 10 years"
        )
    return seconds
