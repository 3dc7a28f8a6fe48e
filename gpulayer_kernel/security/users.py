"""Users (name, role, group, disabled) and quotas (per user or group), kept by the control plane.

Like tokens, the records live in memory in the process that owns the control plane (DESIGN rule
3; a standby loads them when it takes over) and are written through to the MetadataStore. Every
client token belongs to a user; ``identity_of`` turns a token's record into the ``Identity`` it
acts with: the user's role, or the lower role the token was made with. A disabled user's tokens
stop working at once (401 ``user_disabled``) and start again when the user is enabled.

Quotas: ``max_gpus`` (GPUs held at once by running and placed jobs; the scheduler enforces it)
and ``max_queued`` (jobs waiting at once; ``submit`` enforces it), for ``user:<name>`` (a user
who exists: 404 ``user_not_found`` otherwise) or ``group:<name>``; a job must fit both its
user's and its group's.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..contracts import ADMIN_USER
from ..errors import Conflict, InvalidInput, NotFound, QuotaExceeded, Unauthorized
from ..store import MetadataStore, QuotaRecord, TokenRecord, UserRecord
from ..words import count
from .roles import Identity, Role, check_user_name


@dataclass(frozen=True, slots=True)
class Limits:
    """The quotas that apply to one user: its own and its group's (None: none set)."""

    user: QuotaRecord | None = None
    group: QuotaRecord | None = None


def subject(user: str | None = None, group: str | None = None) -> str:
    if (user is None) == (group is None):
        raise InvalidInput("a quota is for one user or one group", hint="give --user or --group")
    return f"user:{check_user_name(user)}" if user else f"group:{check_user_name(group or '')}"


class UserService:
    """Creates, lists and changes users and quotas; answers who a client token acts as."""

    def __init__(self, store: MetadataStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._users: dict[str, UserRecord] = {}
        self._quotas: dict[str, QuotaRecord] = {}

    async def load(self) -> UserService:
        self._users = {u.name: u for u in await self.store.list_users()}
        self._quotas = {q.subject: q for q in await self.store.list_quotas()}
        return self

    async def ensure_admin(self) -> UserRecord:
        """The first admin (``admin``): whatever predates users belongs to it."""
        rec = self._users.get(ADMIN_USER)
        if rec is None:
            rec = await self.add(ADMIN_USER, Role.ADMIN)
        return rec

    # -- users ------------------------------------------------------------------------------------

    def list(self) -> list[UserRecord]:
        return sorted(self._users.values(), key=lambda u: u.name)

    def find(self, name: str) -> UserRecord | None:
        return self._users.get(name)

    def get(self, name: str) -> UserRecord:
        rec = self._users.get(name)
        if rec is None:
            raise NotFound(
                f"no user {name!r}",
                hint="list users with `gpulayer user list`; add one with `gpulayer user add NAME`",
                details={"user": name},
                code="user_not_found",
            )
        return rec

    async def add(
        self, name: str, role: Role | str = Role.USER, *, group: str | None = None
    ) -> UserRecord:
        check_user_name(name)
        if group is not None:
            check_user_name(group, "group")
        if name in self._users:
            raise Conflict(
                f"user {name!r} already exists",
                hint=f"change it with `gpulayer user set {name} ...`",
                code="user_exists",
            )
        rec = UserRecord(name=name, role=Role(role).value, created_at=self.clock(), group=group)
        return await self._save(rec)

    async def update(
        self,
        name: str,
        *,
        role: Role | str | None = None,
        group: str | None = None,
        disabled: bool | None = None,
    ) -> UserRecord:
        rec = self.get(name)
        changes: dict[str, object] = {}
        if role is not None:
            changes["role"] = Role(role).value
        if group is not None:
            changes["group"] = check_user_name(group, "group") if group else None
        if disabled is not None:
            changes["disabled"] = disabled
        new = replace(rec, **changes)  # type: ignore[arg-type]
        if rec.role == Role.ADMIN and (new.role != Role.ADMIN or new.disabled):
            if not [u for u in self._users.values() if u.name != name and _active_admin(u)]:
                raise Conflict(
                    f"{name} is the last active admin",
                    hint="make another user admin first (`gpulayer user set NAME --role admin`)",
                    code="last_admin",
                )
        return await self._save(new)

    async def _save(self, rec: UserRecord) -> UserRecord:
        self._users[rec.name] = rec
        await self.store.save_user(rec)
        return rec

    # -- identity ---------------------------------------------------------------------------------

    def identity_of(self, rec: TokenRecord) -> Identity:
        """Who a client token acts as; Unauthorized when its user is unknown or disabled."""
        name = rec.owner or ADMIN_USER
        user = self._users.get(name)
        if user is None and name == ADMIN_USER:
            user = UserRecord(ADMIN_USER, Role.ADMIN.value, 0.0)  # a home from before users
        if user is None:
            raise Unauthorized(
                f"token {rec.id} belongs to user {name!r}, who does not exist",
                hint="ask an admin to add the user (`gpulayer user add`) or for a new token",
                code="user_unknown",
            )
        if user.disabled:
            raise Unauthorized(
                f"user {name} is disabled, so token {rec.id} does not work",
                hint="ask an admin to enable the user (`gpulayer user enable NAME`)",
                code="user_disabled",
            )
        role = Role(user.role)
        if rec.role is not None and not Role(rec.role).at_least(role):
            role = Role(rec.role)  # a token may carry less than its user's role, never more
        return Identity(name, role)

    def identity_named(self, name: str, default: Role) -> Identity:
        """Who a person signed in elsewhere (jupyter_server's IdentityProvider) acts as: their
        stored role, or ``default`` when they are not a user here. Disabled: Unauthorized."""
        user = self._users.get(name)
        if user is None:
            return Identity(name, default)
        return self.identity_of(TokenRecord(f"user {name}", "client", "", 0.0, None, owner=name))

    def group_of(self, name: str) -> str | None:
        user = self._users.get(name)
        return user.group if user else None

    # -- quotas -----------------------------------------------------------------------------------

    def quotas(self) -> builtins.list[QuotaRecord]:
        return sorted(self._quotas.values(), key=lambda q: q.subject)

    def limits(self, user: str) -> Limits:
        group = self.group_of(user)
        return Limits(
            self._quotas.get(f"user:{user}"),
            self._quotas.get(f"group:{group}") if group else None,
        )

    def check_submit(self, owner: str, gpus: int, queued: Callable[[set[str]], int]) -> None:
        """Refuse (429 ``quota_exceeded``) a job larger than its user's or group's GPU quota, or
        one more job when they are at ``max_queued`` (``queued``: how many of these users'
        jobs wait now)."""
        limits = self.limits(owner)
        group = self.group_of(owner)
        for quota, name in ((limits.user, owner), (limits.group, f"group {group}")):
            if quota is None:
                continue
            if quota.max_gpus is not None and gpus > quota.max_gpus:
                raise QuotaExceeded(
                    f"the job needs {count(gpus, 'GPU')}; the quota of {name} is {quota.max_gpus}",
                    hint="ask for fewer GPUs, or ask an admin to raise the quota "
                    "(`gpulayer quota set`)",
                    details={"subject": quota.subject, "max_gpus": quota.max_gpus, "gpus": gpus},
                )
            if quota.max_queued is not None:
                members = {owner} if name == owner else self.members(group)
                waiting = queued(members)
                if waiting >= quota.max_queued:
                    raise QuotaExceeded(
                        f"{name} has {count(waiting, 'job')} waiting, the most its quota allows "
                        f"({quota.max_queued})",
                        hint="wait for some to start, or cancel some (`gpulayer cancel`)",
                        details={"subject": quota.subject, "max_queued": quota.max_queued},
                    )

    def members(self, group: str | None) -> set[str]:
        return {u.name for u in self._users.values() if group and u.group == group}

    async def set_quota(
        self, subject_: str, *, max_gpus: int | None = None, max_queued: int | None = None
    ) -> QuotaRecord:
        for field, value in (("max_gpus", max_gpus), ("max_queued", max_queued)):
            if value is not None and not 0 <= value <= 1_000_000:
                raise InvalidInput(
                    f"{field} {value} is out of range",
                    hint="a quota is a whole number from 0 (none allowed) up",
                    details={"field": field},
                )
        rec = QuotaRecord(subject_, max_gpus=max_gpus, max_queued=max_queued)
        kind, _, name = subject_.partition(":")
        if kind == "user" and name not in self._users and subject_ not in self._quotas:
            # A quota for a mistyped name would hold back nobody and look as if it did. One kept
            # from a user since gone may still be removed. (Groups need no members yet.)
            raise NotFound(
                f"no user {name!r}: a quota is for a user who exists",
                hint="list users with `gpulayer user list`; add one with `gpulayer user add "
                f"{name}`, or set a group's quota with --group",
                details={"user": name},
                code="user_not_found",
            )
        if max_gpus is None and max_queued is None:
            self._quotas.pop(subject_, None)
            await self.store.delete_quota(subject_)
        else:
            self._quotas[subject_] = rec
            await self.store.save_quota(rec)
        return rec


def _active_admin(u: UserRecord) -> bool:
    return u.role == Role.ADMIN and not u.disabled
