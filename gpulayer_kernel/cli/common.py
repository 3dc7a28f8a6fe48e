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


def stop_signal() -> asyncio.Future[None]:
    """A future done when SIGINT or SIGTERM arrives (the way a served process is asked to stop).

    Its handlers are in place when this returns, so call it before saying "ready": a signal
    sent the moment a supervisor reads that line must not find the default action (death by
    the signal, no goodbye). Cancelling the future, or its end, puts the defaults back."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def fire() -> None:
        if not stop.done():
            stop.set_result(None)

    def restore(_: asyncio.Future[None]) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, fire)
    stop.add_done_callback(restore)
    return stop
