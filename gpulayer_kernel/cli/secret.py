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
    rot = ssub.add_parser(
        "rotate-key",
        help="rotate the key sealing secrets (admins; with a standby: --step add, copy the key "
        "file, --step reseal, --step retire; see docs/security.md)",
    )
    rot.add_argument(
        "--step",
        choices=("all", "add", "reseal", "retire"),
        default="all",
        help="one step of the rotation (default all: for a lone control plane)",
    )
    rot.add_argument("--key", default=None, metavar="ID", help="reseal: the key id to seal with")


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
            done = await admin.rotate_key_step(args.step, args.key)
            print(rotation_advice(done), file=sys.stderr)
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


def rotation_advice(done: dict[str, Any]) -> str:
    """What a rotation step did, and what the admin copies where before the next step."""
    src, keys = done["source"], ", ".join(done["keys"])
    copy = (
        f"copy {src} (it holds {keys}) to every standby of this database, to the path its "
        "--secrets-key names (mode 0600); a standby re-reads it within seconds and says in its "
        "log and /api/v1/health whether it can open every key"
        if done["writable"]
        else f"the keys live in {src}: change that source on every control plane"
    )
    if done["step"] == "add":
        return (
            f"step 1 of 3: key {done['added']} added to {src}; it seals nothing yet.\n"
            f"Now {copy}.\nThen: gpulayer secret rotate-key --step reseal --key {done['added']}"
        )
    if done["step"] == "reseal":
        return (
            f"step 2 of 3: every secret is sealed with key {done['key_id']} now; the old keys "
            f"stay in {src} until retired.\nThen: gpulayer secret rotate-key --step retire"
        )
    if done["step"] == "retire":
        gone = ", ".join(done["retired"]) or "none"
        if not done["writable"]:
            return f"step 3 of 3: no secret is sealed with {gone}: {copy} (drop those keys)."
        return (
            f"step 3 of 3: keys retired: {gone}; every secret is sealed with key "
            f"{done['key_id']}.\nNow {copy}."
        )
    return (
        f"every secret is sealed with key {done['key_id']} now.\nIf standbys share this "
        f"database, {copy} now (next time, rotate in steps: --step add, reseal, retire)."
    )


COMMANDS: dict[str, Handler] = {"secret": cmd_secret}
