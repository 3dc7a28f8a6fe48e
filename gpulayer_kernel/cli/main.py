"""The ``gpulayer`` parser and ``main()``: each command module adds its parsers and handlers."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import GPUlayerError
from ..words import plain
from . import (
    artifacts,
    audit,
    db,
    jobs,
    kernelspec,
    lab,
    providers,
    pull,
    run,
    secret,
    serve,
    sessions,
    token,
    user,
    worker,
)
from .common import Handler

# In the order ``gpulayer --help`` lists their commands.
_MODULES = (
    run,
    jobs,
    sessions,
    pull,
    kernelspec,
    artifacts,
    lab,
    serve,
    worker,
    token,
    secret,
    user,
    providers,
    audit,
    db,
)
COMMANDS: dict[str, Handler] = {name: h for m in _MODULES for name, h in m.COMMANDS.items()}


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gpulayer`` argument parser, every command included."""
    p = argparse.ArgumentParser(
        prog="gpulayer",
        description="Run jobs on the right GPU, from a terminal or from Jupyter.",
    )
    p.add_argument("-V", "--version", action="version", version=f"gpulayer {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _MODULES:
        module.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``gpulayer`` command; errors print as message and hint, exit status 2."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        # Inside the try: a job option's bad value is a BadOption (jobopts.py), said as one.
        if words[:1] == [lab.COMMAND]:
            # JupyterLab's own options (--no-browser, --port 8899, a notebook) pass through as
            # they are; only `gpulayer lab --help` is ours.
            args, extra = parser.parse_known_args(words)
            args.lab_args = extra
        else:
            args = parser.parse_args(words)
        # A command may bring its own event loop (``serve``: uvloop where installed).
        with asyncio.Runner(loop_factory=getattr(args, "loop_factory", None)) as runner:
            return runner.run(COMMANDS[args.command](args))
    except GPUlayerError as exc:
        print(f"gpulayer: error: {plain(exc.message)}", file=sys.stderr)
        if exc.hint:
            print(f"gpulayer: hint: {plain(exc.hint)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """``gpulayer jobs | head``: the reader closed the pipe; end quietly, as ``cat`` would.

    Python would otherwise print a traceback, and again at exit when it flushes stdout into the
    closed pipe: point stdout at /dev/null so that last flush has somewhere to go.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE: what a shell reports for a command the pipe stopped
