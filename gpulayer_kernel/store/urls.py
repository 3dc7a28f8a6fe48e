"""Store URLs in messages: never with their password."""

from __future__ import annotations

from urllib.parse import urlsplit


def shown(url: str) -> str:
    """``url`` without a password, for messages (a PostgreSQL URL may carry one)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    return url.replace(f":{password}@", ":***@", 1)
