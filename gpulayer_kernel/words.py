"""The small words of messages: money, counts, and code marks in plain text (sizes: ``display``).

Messages are written once and read in three places: the Lab panel and the API (where `code`
marks are fine), and plain text (a terminal, a text cell, ``gpulayer`` on stderr), where they
are noise. ``plain`` is what every plain-text printer passes a message through, so messages keep
their marks and no renderer shows them. Standard library only: the control plane, the CLI and
the kernel side all use it.
"""

from __future__ import annotations

import re

_CODE = re.compile(r"`([^`\n]+)`")


def dollars(amount: float, *, short: bool = False) -> str:
    """``$0.00``, ``$1.25``, ``$1,204.50``, ``-$3.10``; never ``$-0.00``. ``short``: no cents
    from $1,000 up (``$1,204``), for tables and one-line summaries.

    A budget overshot by a fraction of a cent has ``-0.0004`` left: it rounds to nothing, and
    nothing has no sign."""
    cents = round(amount, 2)
    sign = "-" if cents < 0 else ""
    a = abs(cents)
    return f"{sign}${a:,.0f}" if short and a >= 1000 else f"{sign}${a:,.2f}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 cell``, ``2 cells``, ``0 cells``; ``plural`` for the nouns that do not take an s."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def plain(text: str) -> str:
    """``text`` without its `code` marks: ``run `gpulayer workers` `` -> ``run gpulayer workers``.

    Only paired marks on one line go; a lone backtick (in a path, in a user's job name) stays."""
    return _CODE.sub(r"\1", text) if "`" in text else text
