"""The secret table: each user's secrets, sealed in the store, opened for a job or the redactor.

Names are per owner: alice's ``HF_TOKEN`` and bob's are two secrets, and a job gets the secrets of
its own owner. Values are sealed by the ``Vault`` before they reach the store and opened only to
hand a job its secrets and to teach the redactor what to mask; nothing returns one to a caller.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterable, Sequence

from ..contracts import Job, check_secret_name
from ..redact import Redactor
from ..security.roles import Identity, Role, check_role, resolved
from ..security.rotation import Rotation, Standbys, rotation_step
from ..security.vault import KeySource, Vault, key_id
from ..store import MetadataStore, SecretRecord


class SecretTable:
    """Sets, lists, deletes and resolves secrets per owner; rotates the key."""

    def __init__(self, store: MetadataStore, redactor: Redactor, keys: KeySource) -> None:
        self.store = store
        self.redactor = redactor
        self.keys = keys
        self._vault: Vault | None = None
        # The key ids each live standby holds (a leader of a PostgreSQL database sets it,
        # ``ha/standby.py``): a re-seal is refused while one lacks the key.
        self.standbys: Callable[[], Awaitable[Standbys]] | None = None

    @property
    def vault(self) -> Vault:
        assert self._vault is not None, "SecretTable.start() first"
        return self._vault

    async def start(self) -> None:
        """Open the vault (refusing a missing or wrong key) and teach the redactor every value."""
        self._vault = await Vault.open(self.keys, self.store)
        for rec in await self.store.list_secrets():
            self.redactor.add(f"{rec.owner}/{rec.name}", self.vault.unseal(rec))

    @staticmethod
    def owner_for(who: Identity | None, user: str | None) -> str:
        """Whose secrets a call means: the caller's own, or (admins only) ``user``'s."""
        me = resolved(who)
        if user is None or user == me.user:
            check_role(who, Role.USER, "manage secrets")
            return me.user
        check_role(who, Role.ADMIN, f"manage the secrets of {user}")
        return user

    async def set(self, owner: str, name: str, value: str) -> None:
        check_secret_name(name)
        await self.store.set_secret(name, self.vault.seal(owner, name, value), owner=owner)
        self.redactor.add(f"{owner}/{name}", value)

    async def names(self, owner: str) -> builtins.list[str]:
        return await self.store.list_secret_names(owner=owner)

    async def all(self, *, who: Identity | None = None) -> builtins.list[SecretRecord]:
        """Every owner's secrets, their values left out (an admin's listing)."""
        check_role(who, Role.ADMIN, "list every user's secrets")
        return [
            SecretRecord(r.owner, r.name, "", r.updated_at) for r in await self.store.list_secrets()
        ]

    async def delete(self, owner: str, name: str) -> bool:
        return await self.store.delete_secret(check_secret_name(name), owner=owner)

    async def resolve(self, owner: str, names: Sequence[str]) -> dict[str, str]:
        """The plaintext of ``owner``'s secrets among ``names`` (missing ones are left out)."""
        sealed = await self.store.get_secrets(names, owner=owner)
        return {n: self.vault.unseal(SecretRecord(owner, n, v, 0.0)) for n, v in sealed.items()}

    async def for_job(self, job: Job) -> dict[str, str]:
        return await self.resolve(job.owner, job.spec.secrets)

    async def for_jobs(self, jobs: Iterable[Job]) -> dict[str, dict[str, str]]:
        """Per owner, the secrets these jobs name (one read per owner)."""
        wanted: dict[str, set[str]] = {}
        for job in jobs:
            wanted.setdefault(job.owner, set()).update(job.spec.secrets)
        return {o: await self.resolve(o, sorted(n)) for o, n in wanted.items() if n}

    async def rotate(self, *, who: Identity | None = None) -> str:
        """Re-seal every secret with a new key; the new key's id (admins only)."""
        return (await self.rotation_step("all", who=who)).key_id

    async def rotation_step(
        self, step: str, key: str | None = None, *, who: Identity | None = None
    ) -> Rotation:
        """One step of the key rotation (add, reseal, retire, or all; admins only)."""
        check_role(who, Role.ADMIN, "rotate the secrets key")
        standbys = await self.standbys() if self.standbys is not None else None
        return await rotation_step(self.vault, self.store, step, key, standbys=standbys)

    def held_key_ids(self) -> builtins.list[str]:
        """The ids of the keys this server holds (the first seals); none before it started."""
        return [key_id(k) for k in self._vault.keys] if self._vault is not None else []
