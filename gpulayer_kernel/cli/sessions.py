"""``gpulayer sessions``: list, show, stop, restart or interrupt sessions (ADR 0019).

A session is started from a notebook (``%gpulayer session start``) or from Python
(``gpulayer_kernel.sessions.start_session``); here, from a terminal, people see who holds which
GPUs and for how long, read a session's cells, and stop one (which frees its GPUs). A session's
output is its job's log: ``gpulayer logs SESSION_ID``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..client.connect import open_session
from .common import Handler

ACTIONS = ("show", "cells", "stop", "restart", "interrupt")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "sessions",
        help="list sessions, or show, stop, restart or interrupt one",
        description="Sessions hold their GPUs and keep state across cells. With no action, "
        "list the live ones. A session is named by its name or its job's id.",
    )
    p.add_argument("action", nargs="?", choices=ACTIONS, help="what to do with one session")
    p.add_argument("session", nargs="?", metavar="NAME|ID")
    p.add_argument("--all", action="store_true", help="list: also sessions that ended lately")
    p.add_argument("--limit", type=int, default=20, help="cells: how many (newest first)")
    p.add_argument("--json", action="store_true")


async def sessions(args: argparse.Namespace) -> int:
    from .. import render

    if args.action is None:
        return await _list(args)
    if not args.session:
        print(f"gpulayer sessions {args.action}: name the session (NAME or ID)")
        return 2
    async with open_session() as s:
        ref = args.session
        if args.action == "show":
            info = await s.get_session(ref)
            if args.json:
                print(info.model_dump_json(indent=2))
                return 0
            print(render.session_line(info))
            for cell in await s.session_cells(ref, limit=10):
                print(f"  {render.cell_line(cell)}")
        elif args.action == "cells":
            cells = await s.session_cells(ref, limit=args.limit)
            if args.json:
                print(json.dumps([c.model_dump(mode="json") for c in cells], indent=2))
                return 0
            for cell in cells:
                print(render.cell_line(cell))
            if not cells:
                print("no cells have run in it yet")
        elif args.action == "stop":
            info = await s.stop_session(ref, "stopped from the command line")
            print(f"session {info.name} stopped: its GPUs are free")
        elif args.action == "restart":
            info = await s.restart_session(ref)
            print(f"session {info.name} is restarting: its ranks start again (state is gone)")
        else:
            info = await s.interrupt_session(ref)
            print(f"KeyboardInterrupt sent to the running cell of session {info.name}")
    return 0


async def _list(args: argparse.Namespace) -> int:
    from .. import render

    async with open_session() as s:
        infos = await s.list_sessions(include_ended=args.all)
    if args.json:
        print(json.dumps([i.model_dump(mode="json") for i in infos], indent=2))
    elif not infos:
        print("no sessions; start one in a notebook with %gpulayer session start")
    else:
        for info in infos:
            print(render.session_line(info))
    return 0


COMMANDS: dict[str, Handler] = {"sessions": sessions}
