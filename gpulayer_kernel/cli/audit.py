"""``gpulayer audit``: who did what, newest first, for admins (ADR 0020, docs/operations.md).

Against the live control plane with an admin's token, or the state directory opened here when
nothing serves it (``admin_session``). Paged: ``--limit`` rows (default 50), ``--before SEQ`` for
the next page; ``--json`` exports one page as JSON (at most 1000 rows: exports are bounded, and a
longer export pages through with ``--before``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from ..controlplane.audit import ACTIONS, MAX_PAGE
from .admin import admin_session
from .common import Handler
from .providers import parse_since


def add_parsers(sub: Any) -> None:
    """Add ``audit`` to the ``gpulayer`` sub-parsers."""
    a = sub.add_parser(
        "audit",
        help="the audit log: who submitted, cancelled, changed roles, tokens, secrets (admins)",
        description="The audit log, newest first: submits, cancels, session stops and attaches, "
        "role, quota and budget changes, tokens and secrets (names and ids, never values).",
    )
    a.add_argument("--user", default=None, help="only this user's actions")
    a.add_argument(
        "--action",
        default=None,
        choices=ACTIONS,
        metavar="ACTION",
        help=f"only this action: {', '.join(ACTIONS)}",
    )
    a.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help='a duration back from now ("7d", "12h"), a date (UTC) or epoch seconds',
    )
    a.add_argument(
        "--limit", type=int, default=50, help=f"rows to show (1 to {MAX_PAGE}; default 50)"
    )
    a.add_argument(
        "--before",
        type=int,
        default=None,
        metavar="SEQ",
        help="rows older than this one (the next page)",
    )
    a.add_argument("--json", action="store_true", help="this page as JSON")


def audit_text(page: dict[str, Any]) -> str:
    rows = page["entries"]
    if not rows:
        return "no audit entries" + (" match" if page["total"] else " yet")
    lines = [f"{'SEQ':>7}  {'WHEN (UTC)':<20}{'USER':<16}{'ACTION':<19}{'TARGET':<26}DETAIL"]
    for r in rows:
        when = dt.datetime.fromtimestamp(r["at"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        detail = " ".join(f"{k}={v}" for k, v in r["detail"].items() if v is not None)
        lines.append(
            f"{r['seq']:>7}  {when:<20}{r['user'][:15]:<16}{r['action']:<19}"
            f"{r['target'][:25]:<26}{detail}"
        )
    shown = f"showing {len(rows)} of {page['total']}"
    if page.get("next_before") is not None:
        shown += f"; next page: --before {page['next_before']}"
    return "\n".join([*lines, shown])


async def cmd_audit(args: argparse.Namespace) -> int:
    async with admin_session() as admin:
        page = await admin.audit(
            user=args.user,
            action=args.action,
            since=parse_since(args.since),
            before=args.before,
            limit=args.limit,
        )
    print(json.dumps(page, indent=2) if args.json else audit_text(page))
    return 0


COMMANDS: dict[str, Handler] = {"audit": cmd_audit}
