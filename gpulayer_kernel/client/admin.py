"""The client calls of administration, for both clients: tokens, secrets, users, quotas.

As in ``calls.py``, each call is written once as a generator of requests; ``AsyncAdmin`` and
``Admin`` are the two clients' methods over them (``clients.py`` mixes them in). Users and quotas
are the async client's only (the CLI's ``gpulayer user|quota``).
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, TypeVar

from .calls import Call, Req, _pid

T = TypeVar("T")


def _user(user: str | None) -> list[tuple[str, str]]:
    """Whose secrets an admin means (none: its own)."""
    return [] if user is None else [("user", user)]


class AdminCalls:
    def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> Call[tuple[dict[str, Any], str]]:
        body = {"kind": kind, "ttl": ttl, "name": name, "user": user, "role": role}
        resp = yield Req("POST", "/tokens", json=body)
        data = resp.json()
        return data["token"], str(data["secret"])

    def list_tokens(self, *, include_inactive: bool = False) -> Call[builtins.list[dict[str, Any]]]:
        resp = yield Req("GET", "/tokens", params=[("all", "1" if include_inactive else "0")])
        return list(resp.json()["tokens"])

    def revoke_token(self, token_id: str) -> Call[dict[str, Any]]:
        data = (yield Req("POST", f"/tokens/{_pid(token_id)}/revoke")).json()
        assert isinstance(data, dict)
        return data

    def set_secret(self, name: str, value: str, *, user: str | None = None) -> Call[None]:
        yield Req("PUT", f"/secrets/{_pid(name)}", params=_user(user), json={"value": value})

    def secret_names(self, *, user: str | None = None) -> Call[builtins.list[str]]:
        resp = yield Req("GET", "/secrets", params=_user(user))
        return [str(n) for n in resp.json()["names"]]

    def delete_secret(self, name: str, *, user: str | None = None) -> Call[bool]:
        resp = yield Req("DELETE", f"/secrets/{_pid(name)}", params=_user(user), ok=(404,))
        return resp.status_code == 204

    def rotate_secrets_key(self) -> Call[str]:
        return str((yield Req("POST", "/secrets/rotate-key")).json()["key_id"])

    def rotate_key_step(self, step: str, key: str | None = None) -> Call[dict[str, Any]]:
        params = [("step", step), *([("key", key)] if key else [])]
        return dict((yield Req("POST", "/secrets/rotate-key", params=params)).json())

    # -- users, quotas, identity -------------------------------------------------------------

    def whoami(self) -> Call[dict[str, Any]]:
        return dict((yield Req("GET", "/whoami")).json())

    def list_users(self) -> Call[builtins.list[dict[str, Any]]]:
        return list((yield Req("GET", "/users")).json()["users"])

    def add_user(
        self, name: str, role: str = "user", *, group: str | None = None
    ) -> Call[dict[str, Any]]:
        body = {"name": name, "role": role, "group": group}
        return dict((yield Req("POST", "/users", json=body)).json())

    def update_user(self, name: str, **changes: Any) -> Call[dict[str, Any]]:
        return dict((yield Req("POST", f"/users/{_pid(name)}", json=changes)).json())

    def list_quotas(self) -> Call[builtins.list[dict[str, Any]]]:
        return list((yield Req("GET", "/quotas")).json()["quotas"])

    def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_queued: int | None
    ) -> Call[dict[str, Any]]:
        body = {"max_gpus": max_gpus, "max_queued": max_queued}
        path = f"/quotas/{_pid(kind)}/{_pid(name)}"
        return dict((yield Req("PUT", path, json=body)).json())

    def audit(self, **filters: Any) -> Call[dict[str, Any]]:
        """A page of the audit log (``user``, ``action``, ``since``, ``before``, ``limit``)."""
        params = [(k, str(v)) for k, v in filters.items() if v is not None]
        return dict((yield Req("GET", "/audit", params=params)).json())


_CALLS = AdminCalls()


class AsyncAdmin:
    """``AsyncClient``'s administration methods (it provides ``_run``)."""

    if TYPE_CHECKING:  # AsyncClient's

        async def _run(self, call: Call[T]) -> T: ...

    async def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        call = _CALLS.create_token(kind, ttl=ttl, name=name, user=user, role=role)
        return await self._run(call)

    async def list_tokens(self, *, include_inactive: bool = False) -> builtins.list[dict[str, Any]]:
        return await self._run(_CALLS.list_tokens(include_inactive=include_inactive))

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        return await self._run(_CALLS.revoke_token(token_id))

    async def set_secret(self, name: str, value: str, *, user: str | None = None) -> None:
        await self._run(_CALLS.set_secret(name, value, user=user))

    async def secret_names(self, *, user: str | None = None) -> builtins.list[str]:
        return await self._run(_CALLS.secret_names(user=user))

    async def delete_secret(self, name: str, *, user: str | None = None) -> bool:
        return await self._run(_CALLS.delete_secret(name, user=user))

    async def rotate_secrets_key(self) -> str:
        return await self._run(_CALLS.rotate_secrets_key())

    async def rotate_key_step(self, step: str, key: str | None = None) -> dict[str, Any]:
        """One step of the secrets key rotation: ``KeyRotated`` as a dict."""
        return await self._run(_CALLS.rotate_key_step(step, key))

    # users, quotas and identity (the CLI's `gpulayer user|quota`; async only)

    async def whoami(self) -> dict[str, Any]:
        return await self._run(_CALLS.whoami())

    async def list_users(self) -> builtins.list[dict[str, Any]]:
        return await self._run(_CALLS.list_users())

    async def add_user(
        self, name: str, role: str = "user", *, group: str | None = None
    ) -> dict[str, Any]:
        return await self._run(_CALLS.add_user(name, role, group=group))

    async def update_user(self, name: str, **changes: Any) -> dict[str, Any]:
        return await self._run(_CALLS.update_user(name, **changes))

    async def list_quotas(self) -> builtins.list[dict[str, Any]]:
        return await self._run(_CALLS.list_quotas())

    async def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_queued: int | None
    ) -> dict[str, Any]:
        call = _CALLS.set_quota(kind, name, max_gpus=max_gpus, max_queued=max_queued)
        return await self._run(call)

    async def audit(self, **filters: Any) -> dict[str, Any]:
        """A page of the audit log (admins): ``AuditPage`` as a dict."""
        return await self._run(_CALLS.audit(**filters))


class Admin:
    """``Client``'s administration methods (it provides ``_run``)."""

    if TYPE_CHECKING:  # Client's

        def _run(self, call: Call[T]) -> T: ...

    def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        return self._run(_CALLS.create_token(kind, ttl=ttl, name=name, user=user, role=role))

    def list_tokens(self, *, include_inactive: bool = False) -> builtins.list[dict[str, Any]]:
        return self._run(_CALLS.list_tokens(include_inactive=include_inactive))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._run(_CALLS.revoke_token(token_id))

    def set_secret(self, name: str, value: str, *, user: str | None = None) -> None:
        self._run(_CALLS.set_secret(name, value, user=user))

    def secret_names(self, *, user: str | None = None) -> builtins.list[str]:
        return self._run(_CALLS.secret_names(user=user))

    def delete_secret(self, name: str, *, user: str | None = None) -> bool:
        return self._run(_CALLS.delete_secret(name, user=user))
