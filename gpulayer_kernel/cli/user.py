"""``gpulayer user add|list|set|disable|enable`` and ``gpulayer quota set|list``: teams.

Against the live control plane with an admin's token (``GPULAYER_URL``/``GPULAYER_TOKEN``, or the
state directory's own), or the state directory opened here when nothing serves it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .admin import admin_session
from .common import Handler

ROLES = ["admin", "user", "viewer"]


def add_parsers(sub: Any) -> None:
    """Add user and quota to the ``gpulayer`` sub-parsers."""
    user = sub.add_parser("user", help="add, list, change, disable users (admins)")
    usub = user.add_subparsers(dest="user_command", required=True, metavar="ACTION")
    add = usub.add_parser("add", help="add a user; then: gpulayer token create --user NAME")
    add.add_argument("name")
    add.add_argument("--role", choices=ROLES, default="user")
    add.add_argument("--group", default=None, help="for group quotas")
    usub.add_parser("list", help="list users")
    change = usub.add_parser("set", help="change a user's role or group")
    change.add_argument("name")
    change.add_argument("--role", choices=ROLES, default=None)
    change.add_argument("--group", default=None, help='"" for none')
    for action, help_ in (
        ("disable", "disable a user: their tokens stop working at once"),
        ("enable", "enable a disabled user again"),
    ):
        usub.add_parser(action, help=help_).add_argument("name")
    quota = sub.add_parser("quota", help="GPU and queue quotas per user or group (admins)")
    qsub = quota.add_subparsers(dest="quota_command", required=True, metavar="ACTION")
    qset = qsub.add_parser("set", help="set (or with neither limit, remove) a quota")
    who = qset.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", default=None)
    who.add_argument("--group", default=None)
    qset.add_argument("--max-gpus", type=int, default=None, help="GPUs held at once")
    qset.add_argument("--max-queued", type=int, default=None, help="jobs waiting at once")
    qsub.add_parser("list", help="list quotas")


def _user_line(u: dict[str, Any]) -> str:
    state = "disabled" if u["disabled"] else "active"
    return f"{u['name']:<24}{u['role']:<8}{state:<10}{u['group'] or '-'}"


async def cmd_user(args: argparse.Namespace) -> int:
    async with admin_session() as admin:
        action = args.user_command
        if action == "list":
            print(f"{'NAME':<24}{'ROLE':<8}{'STATE':<10}GROUP")
            for u in await admin.list_users():
                print(_user_line(u))
            return 0
        if action == "add":
            u = await admin.add_user(args.name, args.role, group=args.group)
            print(
                f"user {u['name']} ({u['role']}) added; give them a token with: "
                f"gpulayer token create --user {u['name']}",
                file=sys.stderr,
            )
            return 0
        if action == "set":
            u = await admin.update_user(args.name, role=args.role, group=args.group)
        else:
            u = await admin.update_user(args.name, disabled=action == "disable")
        print(_user_line(u))
        return 0


async def cmd_quota(args: argparse.Namespace) -> int:
    async with admin_session() as admin:
        if args.quota_command == "list":
            print(f"{'FOR':<30}{'MAX GPUS':<10}MAX QUEUED")
            for q in await admin.list_quotas():
                gpus = "-" if q["max_gpus"] is None else q["max_gpus"]
                queued = "-" if q["max_queued"] is None else q["max_queued"]
                print(f"{q['subject']:<30}{gpus!s:<10}{queued}")
            return 0
        kind, name = ("user", args.user) if args.user else ("group", args.group)
        q = await admin.set_quota(kind, name, max_gpus=args.max_gpus, max_queued=args.max_queued)
        print(f"quota of {q['subject']}: max GPUs {q['max_gpus']}, max queued {q['max_queued']}")
        return 0


COMMANDS: dict[str, Handler] = {"user": cmd_user, "quota": cmd_quota}
