"""What several commands share: the handler type, and the habits of a long-running process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def setup_logging() -> None:
    """Log to stderr at ``$GPULAYER_LOG_LEVEL`` (default INFO), as ``serve`` and ``worker`` do."""
    logging.basicConfig(
        level=os.environ.get("GPULAYER_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if logging.getLogger().level > logging.DEBUG:
        # One line per request is noise at INFO: the access log speaks up for refusals and
        # errors only (GPULAYER_LOG_LEVEL=DEBUG shows every request, never with query strings).
        logging.getLogger("gpulayer.access").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("asyncssh").setLevel(logging.WARNING)  # a line per SSH channel


async def until_signalled() -> None:
    """Return when SIGINT or SIGTERM arrives (the way a served process is asked to stop)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
