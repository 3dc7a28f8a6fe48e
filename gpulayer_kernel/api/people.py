"""The routes of users and quotas (admins), and ``/whoami`` (anyone): thin, like handlers.py.

Users and quotas live in the control plane's ``UserService`` (``security/users.py``); these parse
a contract, call it, and answer a contract. Each declares its least role.
"""

from __future__ import annotations

from ..security import Role, subject
from ..store import QuotaRecord, UserRecord
from .mixin import GLMixin
from .models import (
    QuotaInfo,
    QuotaList,
    QuotaRequest,
    UserChange,
    UserInfo,
    UserList,
    UserRequest,
    WhoAmI,
)
from .ops import op


def user_info(rec: UserRecord) -> UserInfo:
    return UserInfo(
        name=rec.name,
        role=rec.role,  # a Role value, as stored
        group=rec.group,
        disabled=rec.disabled,
        created_at=rec.created_at,
    )


def quota_info(rec: QuotaRecord) -> QuotaInfo:
    return QuotaInfo(subject=rec.subject, max_gpus=rec.max_gpus, max_queued=rec.max_queued)


class WhoAmIHandler(GLMixin):
    route = "/whoami"

    @op("who this token acts as: user, role, group, quotas", answer=WhoAmI, role=Role.VIEWER)
    async def get(self) -> WhoAmI:
        me = self.who
        limits = self.cp.users.limits(me.user)
        quotas = [quota_info(q) for q in (limits.user, limits.group) if q is not None]
        return WhoAmI(
            user=me.user, role=me.role.value, group=self.cp.users.group_of(me.user), quotas=quotas
        )


class UsersHandler(GLMixin):
    route = "/users"

    @op("every user", answer=UserList, role=Role.ADMIN)
    async def get(self) -> UserList:
        return UserList(users=[user_info(u) for u in self.cp.users.list()])

    @op(
        "add a user (then give them a token: POST /tokens with `user`)",
        body=UserRequest,
        answer=UserInfo,
        status=201,
        errors=(409,),
        role=Role.ADMIN,
    )
    async def post(self, body: UserRequest) -> UserInfo:
        rec = await self.cp.add_user(body.name, body.role, group=body.group, who=self.who)
        return user_info(rec)


class UserHandler(GLMixin):
    route = "/users/{name}"

    @op(
        "change a user's role or group, or disable (enable) them: a disabled user's tokens stop "
        "working at once, their sessions are stopped and their queued jobs cancelled (running "
        "jobs finish)",
        body=UserChange,
        answer=UserInfo,
        errors=(404, 409),
        role=Role.ADMIN,
    )
    async def post(self, name: str, body: UserChange) -> UserInfo:
        rec = await self.cp.update_user(
            name, role=body.role, group=body.group, disabled=body.disabled, who=self.who
        )
        return user_info(rec)


class QuotasHandler(GLMixin):
    route = "/quotas"

    @op("every quota", answer=QuotaList, role=Role.ADMIN)
    async def get(self) -> QuotaList:
        return QuotaList(quotas=[quota_info(q) for q in self.cp.users.quotas()])


class QuotaHandler(GLMixin):
    route = "/quotas/{kind}/{name}"

    @op(
        "set the quota of `user/NAME` (a user who exists, else 404 `user_not_found`) or "
        "`group/NAME` (both limits null: remove it)",
        body=QuotaRequest,
        answer=QuotaInfo,
        errors=(404,),
        role=Role.ADMIN,
    )
    async def put(self, kind: str, name: str, body: QuotaRequest) -> QuotaInfo:
        who = subject(name if kind == "user" else None, name if kind == "group" else None)
        rec = await self.cp.users.set_quota(who, max_gpus=body.max_gpus, max_queued=body.max_queued)
        await self.cp.audit.record(
            self.who,
            "quota.set",
            f"{kind}/{name}",
            max_gpus=body.max_gpus,
            max_queued=body.max_queued,
        )
        self.cp.scheduling.kick()  # a raised quota may let a waiting job go
        return quota_info(rec)
