"""Memory a long-lived server frees goes back to the system (issue 32).

glibc's malloc keeps what Python frees in its arenas for reuse, and it raises its mmap threshold
each time a large block is freed, so after a burst of large strings (a job's 64 KiB log pieces, a
kernel's big messages) the server's resident memory stays at the burst's peak long after the
owners ended. :func:`freed` counts the bytes a buffer let go of; once enough has been let go
(``TRIM_AFTER``), and not more often than every ``TRIM_EVERY`` seconds, ``malloc_trim(0)`` hands
the free pages back (it costs about a millisecond per 100 MiB of heap). Elsewhere than glibc it
does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
import time
from collections.abc import Callable

TRIM_AFTER = 16 << 20  # bytes freed before a trim is worth it
TRIM_EVERY = 1.0  # seconds between two trims at most


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl has no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()
_pending = 0
_last = 0.0
_later: asyncio.TimerHandle | None = None


def freed(nbytes: int) -> None:
    """``nbytes`` were let go of; trim the heap when enough was, at most every ``TRIM_EVERY``
    (a trim held back by that runs when the time has come, on the running loop)."""
    global _pending, _later
    _pending += nbytes
    if _TRIM is None or _pending < TRIM_AFTER or _later is not None:
        return
    wait = _last + TRIM_EVERY - time.monotonic()
    if wait <= 0:
        _trim()
        return
    try:
        _later = asyncio.get_running_loop().call_later(wait, _trim)
    except RuntimeError:  # no loop here: the next freed() trims
        pass


def _trim() -> None:
    global _pending, _last, _later
    _pending, _last, _later = 0, time.monotonic(), None
    assert _TRIM is not None
    _TRIM(0)
