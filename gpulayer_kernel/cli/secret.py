"""``gpulayer secret set|list|delete``: secrets that jobs reference by name."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from ..errors import GPUlayerError, InvalidInput
from .admin import admin_session
from .common import Handler


def add_parsers(sub: Any) -> None:
    """Add secret and its actions to the ``gpulayer`` sub-parsers."""
    secret = sub.add_parser("secret", help="store secrets that jobs reference by name")
    ssub = secret.add_subparsers(dest="secret_command", required=True, metavar="ACTION")
    sset = ssub.add_parser("set", help="set NAME from stdin (or a hidden prompt)")
    sset.add_argument("name")
    slist = ssub.add_parser("list", help="list secret names (values are never shown)")
    sdel = ssub.add_parser("delete", help="delete a secret")
    sdel.add_argument("name")
    for p in (sset, slist, sdel):
        p.add_argument("--user", default=None, help="admins: another user's secrets")
    ssub.add_parser(
        "rotate-key", help="re-seal every secret with a new key (admins; see docs/security.md)"
    )


def _read_secret(name: str) -> str:
    if sys.stdin.isatty():
        value = getpass.getpass(f"value of {name} (not echoed): ")
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value
    if not value:
        raise InvalidInput(
            f"no value given for {name}",
            hint=f'pipe it in: printf %s "$VALUE" | gpulayer secret set {name}',
        )
    return value


async def cmd_secret(args: argparse.Namespace) -> int:
    if args.secret_command == "set":
        value = _read_secret(args.name)  # before connecting: a prompt must not hold a connection
        async with admin_session() as admin:
            await admin.set_secret(args.name, value, user=args.user)
        print(f"secret {args.name} set; jobs use it with --secret {args.name}", file=sys.stderr)
        return 0
    async with admin_session() as admin:
        if args.secret_command == "rotate-key":
            key_id = await admin.rotate_secrets_key()
            print(f"every secret is sealed with key {key_id} now", file=sys.stderr)
            return 0
        if args.secret_command == "list":
            for name in await admin.secret_names(user=args.user):
                print(name)
            return 0
        if not await admin.delete_secret(args.name, user=args.user):
            raise GPUlayerError(
                f"no secret {args.name!r}", hint="list them with `gpulayer secret list`"
            )
        print(f"secret {args.name} deleted", file=sys.stderr)
        return 0


COMMANDS: dict[str, Handler] = {"secret": cmd_secret}
