"""``gpulayer pull SESSION PATH...``: files a session's worker kept (over the size cap) into the
notebook's folder, with progress (ADR 0022, docs/workspace.md).

Run it on the Jupyter host: the notebook's folder is there. A file changed in the folder since
it was last synced is kept, and the worker's copy lands beside it (``model.worker-1.pt``).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..client.connect import open_session
from .common import Handler


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "pull",
        help="bring files a session's worker kept into the notebook's folder",
        description="Outputs over the size cap stay on the worker after a cell, listed in one "
        "line. This fetches them, whatever their size, into the folder the session synced.",
    )
    p.add_argument("session", metavar="NAME|ID", help="the session (or GPU kernel)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="as the cell's note lists them")


async def pull(args: argparse.Namespace) -> int:
    from ..client.workspace import link_for
    from ..workspace.pulls import progress_line, pull_files

    async with open_session() as s:
        info = await s.get_session(args.session)
        said = await pull_files(link_for(s), info.id, list(args.paths), progress_line())
    print(said)
    return 0


COMMANDS: dict[str, Handler] = {"pull": pull}
