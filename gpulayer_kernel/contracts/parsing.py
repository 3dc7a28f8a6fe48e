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
