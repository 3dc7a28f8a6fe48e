"""Who is asking (``Identity``: a user name and a role) and the rules every check applies.

One mechanism for every host and every call that reads or acts on someone's work:

- an HTTP handler gets the caller's ``Identity`` from its client token (``gpulayer serve``) or
  from jupyter_server's ``IdentityProvider`` (inside Jupyter), as ``self.who``;
- each ``@op`` declares the least role it needs (``roles=``: viewer, user or admin), checked
  before the handler runs;
- ControlPlane calls that read or act on someone's work take ``who=`` and check ownership with
  ``check_read`` / ``check_act`` below. ``who=None`` is the embedded single user, who is admin,
  so the embedded default needs no set-up.

| role   | reads                         | acts on                              | manages          |
| ------ | ----------------------------- | ------------------------------------ | ---------------- |
| viewer | every job, log, worker, event | nothing                              | nothing          |
| user   | its own jobs; workers, events | its own jobs, secrets, client tokens | nothing          |
| admin  | everything                    | everything                           | users, quotas,   |
|        |                               |                                      | tokens, workers  |

Secret values are never read back by anyone (``security.vault``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from ..contracts import ADMIN_USER
from ..errors import Forbidden, InvalidInput

USER_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")


class Role(StrEnum):
    VIEWER = "viewer"
    USER = "user"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def at_least(self, other: Role) -> bool:
        return self.rank >= other.rank


_RANK = {Role.VIEWER: 0, Role.USER: 1, Role.ADMIN: 2}


@dataclass(frozen=True, slots=True)
class Identity:
    """The caller of a control-plane call: a user name and the role it acts with now."""

    user: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


#: ``who=None``: the embedded single user, who is admin.
EMBEDDED = Identity(ADMIN_USER, Role.ADMIN)


def resolved(who: Identity | None) -> Identity:
    return EMBEDDED if who is None else who


def check_user_name(name: str, field: str = "user") -> str:
    if not USER_NAME_RE.match(name):
        raise InvalidInput(
            f"{field} {name!r} is not a valid user name",
            hint="1 to 64 of letters, digits and _ . @ - (not starting with . @ or -)",
            details={"field": field, "value": name},
            code="bad_user_name",
        )
    return name


def check_role(who: Identity | None, need: Role, action: str) -> None:
    """Forbidden (403 ``role_forbidden``) unless ``who`` has at least the role ``need``."""
    me = resolved(who)
    if not me.role.at_least(need):
        raise Forbidden(
            f"{me.user} ({me.role.value}) may not {action}: that needs the {need.value} role",
            hint="ask an admin for a token with that role (`gpulayer token create --user NAME "
            "--role ROLE`)",
            details={"user": me.user, "role": me.role.value, "needs": need.value},
            code="role_forbidden",
        )


def sees_all(who: Identity | None) -> bool:
    """Admins and viewers read everyone's work; a user only its own."""
    return resolved(who).role is not Role.USER


def can_read(who: Identity | None, owner: str) -> bool:
    """Admins and viewers read everything; a user reads what it owns."""
    me = resolved(who)
    return me.role is not Role.USER or me.user == owner


def can_act(who: Identity | None, owner: str) -> bool:
    """Admins act on everything; a user acts on what it owns; a viewer on nothing."""
    me = resolved(who)
    return me.is_admin or (me.role is Role.USER and me.user == owner)


def not_yours(what: str, code: str = "not_yours") -> Forbidden:
    return Forbidden(
        f"{what} belongs to another user",
        hint="you can see and change only your own work; ask its owner or an admin",
        code=code,
    )


def check_read(who: Identity | None, owner: str, what: str) -> None:
    if not can_read(who, owner):
        raise not_yours(what)


def check_act(who: Identity | None, owner: str, what: str) -> None:
    if not can_act(who, owner):
        if can_read(who, owner):  # a viewer: it may look, not touch
            check_role(who, Role.USER, f"change {what}")
        raise not_yours(what)
