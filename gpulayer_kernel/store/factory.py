"""Open a metadata store from a URL: the one place that maps URL schemes to implementations.

    open_store("sqlite:///home/me/.gpulayer/gpulayer.db")    # a file: sqlite:// + its absolute path
    open_store("sqlite:///:memory:")                        # private to one connection, for tests
    open_store("postgresql://gl:pw@db.example:5432/gpulayer")  # a team's server (asyncpg)

The store comes back unopened (``await store.open()``), as the constructors give it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import InvalidInput
from .base import MetadataStore
from .sqlite import SqliteStore
from .urls import shown as _shown

SCHEMES = ("sqlite", "postgresql", "postgres")
_EXAMPLES = "sqlite:///abs/path/gpulayer.db, sqlite:///:memory:, postgresql://USER@HOST/DB"


def open_store(url: str) -> MetadataStore:
    """The ``MetadataStore`` that ``url`` names (unopened)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise InvalidInput(
            f"unsupported store URL {_shown(url)}: supported schemes are "
            f"{', '.join(s + '://' for s in SCHEMES)}",
            hint=f"for example {_EXAMPLES}",
            details={"url": _shown(url), "schemes": list(SCHEMES)},
            code="store_url",
        )
    if scheme.lower() in ("postgresql", "postgres"):
        if not urlsplit(url).path.strip("/"):
            raise _bad(url, "names no database (postgresql://USER@HOST/DATABASE)")
        from .postgres import PostgresStore

        return PostgresStore(url)
    if "?" in rest or "#" in rest:
        raise _bad(url, "takes no options (?...) or fragment (#...)")
    if rest == "/:memory:":
        return SqliteStore(":memory:")
    if not rest.startswith("/"):
        raise _bad(url, "names a host; a SQLite file is named by its path, sqlite:///<path>")
    if rest == "/":
        raise _bad(url, "names no file")
    return SqliteStore(rest)


def _bad(url: str, why: str) -> InvalidInput:
    return InvalidInput(
        f"store URL {_shown(url)} {why}",
        hint=f"for example {_EXAMPLES}",
        details={"url": _shown(url)},
        code="store_url",
    )
