"""The ``gpulayer`` parser and ``main()``: each command module adds its parsers and handlers."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ..errors import GPUlayerError
from . import jobs, lab, run, secret, serve, token, worker
from .common import Handler

# In the order ``gpulayer --help`` lists their commands.
_MODULES = (run, jobs, lab, serve, worker, token, secret)
COMMANDS: dict[str, Handler] = {name: h for m in _MODULES for name, h in m.COMMANDS.items()}


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gpulayer`` argument parser, every command included."""
    p = argparse.ArgumentParser(
        prog="gpulayer",
        description="Run jobs on the right GPU, from a terminal or from Jupyter.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _MODULES:
        module.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``gpulayer`` command; errors print as message and hint, exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except GPUlayerError as exc:
        print(f"gpulayer: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"gpulayer: hint: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
