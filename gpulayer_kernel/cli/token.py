"""``gpulayer token create|list|revoke``: client, join and instance tokens."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .admin import admin_session
from .common import Handler


def add_parsers(sub: Any) -> None:
    """Add token and its actions to the ``gpulayer`` sub-parsers."""
    token = sub.add_parser("token", help="create, list and revoke tokens")
    tsub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = tsub.add_parser("create", help="create a token (shown once)")
    create.add_argument("--kind", choices=["client", "join", "instance"], default="client")
    create.add_argument("--ttl", default=None, help="lifetime: 90 (s), 30m, 1h, 7d (default never)")
    create.add_argument("--name", default="", help="a note to recognise it by")
    create.add_argument(
        "--user", default=None, help="client tokens: whose (default: yours; admins: anyone's)"
    )
    create.add_argument(
        "--role",
        choices=["admin", "user", "viewer"],
        default=None,
        help="client tokens: act with this role, at most the user's (default: the user's)",
    )
    tlist = tsub.add_parser("list", help="list tokens (never their secrets)")
    tlist.add_argument("--all", action="store_true", help="also revoked, expired and used ones")
    revoke = tsub.add_parser("revoke", help="revoke a token; it stops working at once")
    revoke.add_argument("id", help="the token's id (the part after glt_x_)")


def _when(t: float | None) -> str:
    if t is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


async def cmd_token(args: argparse.Namespace) -> int:
    from ..security import parse_ttl

    async with admin_session() as admin:
        if args.token_command == "create":
            info, secret = await admin.create_token(
                args.kind, ttl=parse_ttl(args.ttl), name=args.name, user=args.user, role=args.role
            )
            print(secret)
            print(
                f"gpulayer: {info['kind']} token {info['id']} created, expires "
                f"{_when(info['expires_at'])}; it is shown only this once",
                file=sys.stderr,
            )
            return 0
        if args.token_command == "list":
            tokens = await admin.list_tokens(include_inactive=args.all)
            print(
                f"{'ID':<14}{'KIND':<10}{'STATE':<9}{'CREATED':<18}{'EXPIRES':<18}"
                f"{'LAST USED':<18}NAME"
            )
            for t in tokens:
                note = t["name"] + (f" (worker {t['worker_id']})" if t["worker_id"] else "")
                if t.get("user"):
                    note += f" (user {t['user']}" + (f", {t['role']})" if t.get("role") else ")")
                print(
                    f"{t['id']:<14}{t['kind']:<10}{t['state']:<9}{_when(t['created_at']):<18}"
                    f"{_when(t['expires_at']):<18}{_when(t.get('last_used')):<18}{note}"
                )
            return 0
        info = await admin.revoke_token(args.id)
        print(f"token {info['id']} ({info['kind']}): {info['state']}")
        return 0


COMMANDS: dict[str, Handler] = {"token": cmd_token}
