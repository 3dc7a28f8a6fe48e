"""Small text forms that every edge accepts (CLI flags, magic options, query parameters)."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import InvalidInput, ValidationFailed
from .jobs import ENV_NAME_RE


def parse_pairs(items: Iterable[str], flag: str) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` -> ``{"A": "1", "B": "x=y"}``; an item without ``=`` or a key names
    ``flag`` in its error. Later items win, as on a command line."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(
                f"{flag} {item!r} is not KEY=VALUE",
                hint=f"write it as {flag} NAME=value",
                details={"field": flag, "value": item},
            )
        out[key] = value
    return out


_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, flag: str) -> float:
    """``"30m"``, ``"2h"``, ``"90s"``, ``"1.5h"`` or plain seconds (``"1800"``) → seconds."""
    raw = text.strip().lower()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :] or "s"
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise InvalidInput(
            f"{flag} {text!r} is not a duration",
            hint=f"write seconds or a number with s, m, h or d: {flag} 30m",
            details={"field": flag, "value": text},
        ) from None
    if not value > 0 or value != value:
        raise InvalidInput(f"{flag} {text!r} must be more than 0", details={"field": flag})
    return value


def check_secret_name(name: str) -> str:
    """Secret names are environment variable names (jobs see them as such).

    A bad name is ``ValidationFailed`` (422), as the same rule inside a ``JobSpec`` is."""
    if not ENV_NAME_RE.match(name):
        raise ValidationFailed(
            f"{name!r} is not a valid secret name",
            hint="secret names are environment variable names: letters, digits and _",
            details={"name": name},
        )
    return name
