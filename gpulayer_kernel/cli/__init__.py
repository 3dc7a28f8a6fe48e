"""The ``gpulayer`` command line: a thin edge that parses, calls the control plane, and prints.

One module per concern, each adding its parsers (``add_parsers``) and handlers (``COMMANDS``):
``run`` (with ``live``: its progress line); ``jobs`` (jobs, logs, show, explain, cancel,
workers); ``artifacts``; ``lab``; ``serve``; ``worker``; ``token``; ``secret`` (the last two share
``admin``). ``main`` wires them into one parser.

Job commands work against whichever control plane ``session.open_session`` finds: a served one
(``GPULAYER_URL``), the live owner of ``$GPULAYER_HOME``, or the embedded default in-process.
"""

from __future__ import annotations

from .main import build_parser, main

__all__ = ["build_parser", "main"]
