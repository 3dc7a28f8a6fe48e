"""The token and secret calls, against the live control plane or the state directory itself.

``admin_session()`` talks to the live control plane when there is one (``GPULAYER_URL``, or the
lock file of ``$GPULAYER_HOME``), else it opens the state directory directly.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from ..errors import InvalidInput


class Admin(Protocol):
    """The admin calls shared by the HTTP client and :class:`LocalAdmin`."""

    async def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> tuple[dict[str, Any], str]: ...
    async def list_tokens(self, *, include_inactive: bool = False) -> list[dict[str, Any]]: ...
    async def revoke_token(self, token_id: str) -> dict[str, Any]: ...
    async def set_secret(self, name: str, value: str, *, user: str | None = None) -> None: ...
    async def secret_names(self, *, user: str | None = None) -> list[str]: ...
    async def delete_secret(self, name: str, *, user: str | None = None) -> bool: ...
    async def rotate_secrets_key(self) -> str: ...
    async def rotate_key_step(self, step: str, key: str | None = None) -> dict[str, Any]: ...
    async def list_users(self) -> list[dict[str, Any]]: ...
    async def add_user(
        self, name: str, role: str = "user", *, group: str | None = None
    ) -> dict[str, Any]: ...
    async def update_user(self, name: str, **changes: Any) -> dict[str, Any]: ...
    async def list_quotas(self) -> list[dict[str, Any]]: ...
    async def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_queued: int | None
    ) -> dict[str, Any]: ...
    async def audit(self, **filters: Any) -> dict[str, Any]: ...


class LocalAdmin:
    """The admin calls against a state directory opened here (no server is running)."""

    def __init__(self, cp: Any, tokens: Any) -> None:
        self.cp = cp
        self.tokens = tokens

    def _info(self, rec: Any) -> dict[str, Any]:
        from ..api.handlers import token_info

        return token_info(rec, time.time()).model_dump(mode="json")

    async def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        if kind not in ("client", "join", "instance"):
            raise InvalidInput(
                f"cannot create a {kind} token", hint="worker session tokens are issued by joining"
            )
        rec, secret = await self.tokens.create_for(
            None, kind, ttl=ttl, name=name, owner=user, role=role
        )
        return self._info(rec), secret

    async def list_tokens(self, *, include_inactive: bool = False) -> list[dict[str, Any]]:
        return [self._info(r) for r in self.tokens.list(include_inactive=include_inactive)]

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._info(await self.tokens.revoke_for(None, token_id))  # audited

    async def set_secret(self, name: str, value: str, *, user: str | None = None) -> None:
        await self.cp.set_secret(name, value, user=user)

    async def secret_names(self, *, user: str | None = None) -> list[str]:
        return list(await self.cp.secret_names(user=user))

    async def delete_secret(self, name: str, *, user: str | None = None) -> bool:
        return bool(await self.cp.delete_secret(name, user=user))

    async def rotate_secrets_key(self) -> str:
        return str(await self.cp.secrets.rotate())

    async def rotate_key_step(self, step: str, key: str | None = None) -> dict[str, Any]:
        from ..api.handlers import audit_rotation, key_rotated

        done = await self.cp.secrets.rotation_step(step, key)
        await audit_rotation(self.cp, None, done)
        return key_rotated(done).model_dump(mode="json")

    async def list_users(self) -> list[dict[str, Any]]:
        from ..api.people import user_info

        return [user_info(u).model_dump(mode="json") for u in self.cp.users.list()]

    async def add_user(
        self, name: str, role: str = "user", *, group: str | None = None
    ) -> dict[str, Any]:
        from ..api.people import user_info

        return user_info(await self.cp.add_user(name, role, group=group)).model_dump(mode="json")

    async def update_user(self, name: str, **changes: Any) -> dict[str, Any]:
        from ..api.people import user_info

        return user_info(await self.cp.update_user(name, **changes)).model_dump(mode="json")

    async def list_quotas(self) -> list[dict[str, Any]]:
        from ..api.people import quota_info

        return [quota_info(q).model_dump(mode="json") for q in self.cp.users.quotas()]

    async def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_queued: int | None
    ) -> dict[str, Any]:
        from ..api.people import quota_info
        from ..security import subject

        who = subject(name if kind == "user" else None, name if kind == "group" else None)
        rec = await self.cp.users.set_quota(who, max_gpus=max_gpus, max_queued=max_queued)
        await self.cp.audit.record(
            None, "quota.set", f"{kind}/{name}", max_gpus=max_gpus, max_queued=max_queued
        )
        return quota_info(rec).model_dump(mode="json")

    async def audit(self, **filters: Any) -> dict[str, Any]:
        page = await self.cp.audit.page(**filters)
        return dict(page.model_dump(mode="json"))


@contextlib.asynccontextmanager
async def admin_session() -> AsyncIterator[Admin]:
    """Yield the admin calls of the live control plane, or of the state directory opened here."""
    from ..client.connect import find_remote

    remote = find_remote()
    if remote is not None:
        from ..client.clients import AsyncClient

        async with AsyncClient(remote[0], remote[1]) as client:
            yield client
        return
    from ..embedded import Embedded
    from ..security import TokenService

    async with Embedded(local_worker=False) as emb:
        tokens = await TokenService(emb.store, users=emb.cp.users).load()
        tokens.audit = emb.cp.audit.record  # as the server's: token changes are audited
        yield LocalAdmin(emb.cp, tokens)
