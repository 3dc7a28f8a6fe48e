"""Bearer tokens (ADR 0003): five kinds, random, shown once, stored as a hash, expiring, revocable.

A token reads ``glt_<k>_<id>_<secret>``:

    glt_  c|j|w|i|s  _  <id: 12 hex>  _  <secret: secrets.token_urlsafe(32)>
          │                  │
          │                  └─ the store's key, safe to show (``gpulayer token list``, logs)
          └─ client · join · worker session · single-use instance · scoped to a job

Only ``sha256(id:secret)`` is kept; the secret is printed once at creation. Checking a token is a
dictionary lookup by id and one ``hmac.compare_digest``; the records live in memory (this process
owns the state directory, DESIGN rule 3) and are written through to the MetadataStore.

| kind     | who holds it                      | accepted by                          |
| -------- | --------------------------------- | ------------------------------------ |
| client   | users, notebooks, the Lab panel   | user routes                          |
| join     | operators enrolling workers       | ``POST /workers/join`` (reusable)    |
| instance | one provisioned machine           | ``POST /workers/join``, one success  |
| worker   | one enrolled worker (its session) | worker routes, for its own jobs only |
| job      | the code of one job, kernel or session | user routes, as its owner (role ≤ user), |
|          | (``$GPULAYER_TOKEN`` there, ADR 0022) | while the job lives; never the token routes |

A job token is derived, not stored (``job_tokens.py``).

A client token belongs to a user and acts with that user's role, or a lower one it was made with
(``users.UserService.identity_of``); the ``*_for(who, ...)`` calls apply who may make, see and
revoke which tokens: an admin any, a user only its own client tokens, a viewer none.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from ..contracts import ADMIN_USER
from ..errors import Forbidden, InvalidInput, NotFound, Unauthorized
from ..store import MetadataStore, TokenRecord
from .job_tokens import JOB_PREFIX, JobTokens, job_record
from .roles import Identity, Role, check_role, not_yours, resolved

if TYPE_CHECKING:
    from .users import UserService

log = logging.getLogger("gpulayer.security")

PREFIX = "glt"
# A token's last use is written at most this often (seconds): one row a minute per token.
LAST_USED_EVERY = 60.0
_ID_RE = re.compile(r"^[0-9a-f]{12}$")
# Compared against when a token id is unknown, so both paths cost one hash and one compare.
_DUMMY_HASH = hashlib.sha256(b"gpulayer-unknown-token").hexdigest()


class TokenKind(StrEnum):
    CLIENT = "client"
    JOIN = "join"
    WORKER = "worker"
    INSTANCE = "instance"
    JOB = "job"  # scoped to one job: what runs in it reaches its control plane as its owner


KIND_LETTERS: dict[TokenKind, str] = {
    TokenKind.CLIENT: "c",
    TokenKind.JOIN: "j",
    TokenKind.WORKER: "w",
    TokenKind.INSTANCE: "i",
    TokenKind.JOB: "s",
}
_LETTER_KINDS = {v: k for k, v in KIND_LETTERS.items()}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: the token's kind and id, and for a worker session its worker."""

    kind: TokenKind
    token_id: str
    worker_id: str | None = None
    name: str = ""
    # For a client token: the user it belongs to and the role it acts with.
    identity: Identity | None = None
    # For an instance token: the worker's enrolment nonce (``client.calls.ENROLMENT``), if sent.
    enrolment: str | None = None


def _check_kind(kind: TokenKind, kinds: Collection[TokenKind]) -> None:
    if kind not in kinds:
        wanted = " or ".join(sorted(k.value for k in kinds))
        raise Forbidden(
            f"a {kind.value} token cannot be used here (this endpoint takes a {wanted} token)",
            hint="each endpoint accepts only its kinds of token; see docs/security.md",
            details={"token_kind": kind.value, "accepted": sorted(k.value for k in kinds)},
            code="wrong_token_kind",
        )


# A worker joining with an instance token sends a random nonce of its own, the same on each try of
# that enrolment. Its worker id is derived from it: stored with the spent token, it lets a retry
# whose first answer was lost (the control plane killed before the answer left, a failover) be
# that worker again, and nobody else (the nonce never leaves the request; the id does not reveal
# it). Without a nonce (an older worker) the token is single-use as before. The nonce travels in
# the header ``client.calls.ENROLMENT``.
_NONCE_RE = re.compile(r"^[0-9a-f]{32,64}$")


def enrolled_worker_id(token_id: str, nonce: str) -> str:
    """The worker id an instance token's enrolment with ``nonce`` makes (as ``new_id``'s)."""
    return hashlib.sha256(f"enrolment:{token_id}:{nonce}".encode()).hexdigest()[:12]


def _replayed(token_id: str) -> Unauthorized:
    log.warning("refused a second use of single-use instance token %s", token_id)
    return Unauthorized(
        f"instance token {token_id} was already used",
        hint="an instance token enrols one machine once; create a new one for a new machine",
        code="token_replayed",
    )


def _hash(token_id: str, secret: str) -> str:
    return hashlib.sha256(f"{token_id}:{secret}".encode()).hexdigest()


def token_state(rec: TokenRecord, now: float) -> str:
    """``active``, ``revoked``, ``expired`` or ``used`` (a spent instance token)."""
    if rec.revoked:
        return "revoked"
    if rec.expires_at is not None and now >= rec.expires_at:
        return "expired"
    if rec.kind == TokenKind.INSTANCE and rec.used:
        return "used"
    return "active"


class TokenService:
    """Creates, checks, lists and revokes tokens; the only code that sees a token's secret."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        clock: Callable[[], float] = time.time,
        users: UserService | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        # Who client tokens belong to (the control plane's ``users``; ``api.make_context`` wires
        # it). Without: a client token acts as its recorded owner and role (default admin).
        self.users = users
        # The control plane's ``AuditLog.record`` (``api.make_context`` wires it): token
        # creation and revocation are audited, with ids and names, never the secret.
        self.audit: Callable[..., Awaitable[None]] | None = None
        # Job tokens: derived, not stored (``api.make_context`` wires whose live job is whose).
        self.jobs = JobTokens(store)
        self._records: dict[str, TokenRecord] = {}
        self._enrolling: set[str] = set()  # instance tokens whose enrolment runs here now

    async def load(self) -> TokenService:
        uses = await self.store.token_uses()
        self._records = {
            r.id: replace(r, last_used=uses.get(r.id)) for r in await self.store.list_tokens()
        }
        return self

    # -- issuing ---------------------------------------------------------------------------------

    async def create(
        self,
        kind: TokenKind | str,
        *,
        ttl: float | None = None,
        name: str = "",
        worker_id: str | None = None,
        owner: str | None = None,
        role: Role | str | None = None,
    ) -> tuple[TokenRecord, str]:
        """A new token: returns its record and the secret text, which is never stored.

        A client token belongs to ``owner`` (default: the admin) and acts with ``role`` if given
        (it can never act with more than its user's role)."""
        kind = TokenKind(kind)
        if kind == TokenKind.WORKER and worker_id is None:
            raise InvalidInput("a worker session token needs its worker id")
        if kind == TokenKind.JOB:
            raise InvalidInput(
                "a job token is not made on its own: a served worker gets one with each job",
                hint="outside a job, use a client token (`gpulayer token create`)",
                code="job_token_derived",
            )
        if kind == TokenKind.CLIENT:
            owner = owner or ADMIN_USER
            role = None if role is None else Role(role).value
        elif owner is not None or role is not None:
            raise InvalidInput(
                f"a {kind.value} token belongs to no user",
                hint="--user and --role are for client tokens",
                code="token_user",
            )
        token_id = secrets.token_hex(6)
        while token_id in self._records:  # pragma: no cover - 48 random bits
            token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        now = self.clock()
        rec = TokenRecord(
            id=token_id,
            kind=kind.value,
            hash=_hash(token_id, secret),
            created_at=now,
            expires_at=None if ttl is None else now + ttl,
            worker_id=worker_id,
            name=name,
            owner=owner,
            role=role,
        )
        self._records[token_id] = rec
        await self.store.save_token(rec)
        return rec, f"{PREFIX}_{KIND_LETTERS[kind]}_{token_id}_{secret}"

    async def issue_job_token(self, job_id: str) -> str:
        """A token for the code of job ``job_id`` (``job_tokens.py``): its owner, at most the user
        role, valid while the job lives. Derived, not stored."""
        return f"{PREFIX}_{KIND_LETTERS[TokenKind.JOB]}_{job_id}_{await self.jobs.mac(job_id)}"

    async def issue_worker_session(self, worker_id: str, name: str = "") -> str:
        """A fresh session token for ``worker_id``; its earlier sessions stop working (rotation)."""
        await self.revoke_where(lambda r: r.kind == TokenKind.WORKER and r.worker_id == worker_id)
        _, text = await self.create(TokenKind.WORKER, worker_id=worker_id, name=name)
        return text

    # -- checking --------------------------------------------------------------------------------

    async def authenticate(
        self, text: str | None, kinds: Collection[TokenKind], *, enrolment: str | None = None
    ) -> Principal:
        """The principal behind ``text`` if it is valid and one of ``kinds``; ``enrolment``: an
        instance token's enrolment nonce (``client.calls.ENROLMENT``), ignored for other kinds.

        Unauthorized (401): missing, malformed, unknown, wrong secret, expired, revoked, replayed.
        Forbidden (403): a valid token of a kind this endpoint does not accept.
        It only checks: an instance token is spent by ``spending``, once the use succeeds.
        """
        if not text:
            raise Unauthorized(
                "no token was sent",
                hint="send it as the header 'Authorization: Bearer <token>' (tokens are never "
                "accepted in URLs); create one with `gpulayer token create`",
                code="token_missing",
            )
        parts = text.split("_", 3)
        if (
            len(parts) != 4
            or parts[0] != PREFIX
            or parts[1] not in _LETTER_KINDS
            or not _ID_RE.match(parts[2])
        ):
            raise Unauthorized(
                "the token is malformed",
                hint="GPUlayer tokens look like glt_c_<id>_<secret>; copy the whole token",
                code="token_malformed",
            )
        _, letter, token_id, secret = parts
        rec = self._records.get(token_id)
        if rec is None and letter == KIND_LETTERS[TokenKind.JOB]:
            await self.jobs.verify(token_id, secret)
            _check_kind(TokenKind.JOB, kinds)
            return self._principal(job_record(token_id, self.jobs.live_owner(token_id, token_id)))
        ok = hmac.compare_digest(rec.hash if rec else _DUMMY_HASH, _hash(token_id, secret))
        if rec is None or not ok or KIND_LETTERS[TokenKind(rec.kind)] != letter:
            raise Unauthorized(
                f"token {token_id} is not valid",
                hint="ask an operator for a new token (`gpulayer token create`)",
                code="token_invalid",
            )
        kind = TokenKind(rec.kind)
        state = token_state(rec, self.clock())
        if state == "revoked":
            raise Unauthorized(
                f"token {token_id} was revoked", hint="ask for a new token", code="token_revoked"
            )
        if state == "expired":
            raise Unauthorized(
                f"token {token_id} has expired", hint="ask for a new token", code="token_expired"
            )
        _check_kind(kind, kinds)
        if kind != TokenKind.INSTANCE or (enrolment is not None and not _NONCE_RE.match(enrolment)):
            enrolment = None  # a malformed nonce is no nonce: single use, as an older worker's
        if state == "used" and not self._retried(rec, enrolment):
            raise _replayed(token_id)
        if kind == TokenKind.JOB:  # a stored one, made before job tokens were derived
            self.jobs.live_owner(token_id, rec.name.removeprefix(JOB_PREFIX))
        self._used(rec)
        return self._principal(rec, enrolment)

    def _principal(self, rec: TokenRecord, enrolment: str | None = None) -> Principal:
        kind = TokenKind(rec.kind)
        identity = self.identity_of(rec) if kind in (TokenKind.CLIENT, TokenKind.JOB) else None
        worker_id = rec.worker_id
        if enrolment is not None and worker_id is None:
            worker_id = enrolled_worker_id(rec.id, enrolment)
        return Principal(
            kind=kind,
            token_id=rec.id,
            worker_id=worker_id,
            name=rec.name,
            identity=identity,
            enrolment=enrolment,
        )

    def _retried(self, rec: TokenRecord, enrolment: str | None) -> bool:
        """A spent instance token sent again by the enrolment that spent it (its nonce), once
        that enrolment has ended here: the worker did not get its answer."""
        return (
            enrolment is not None
            and rec.id not in self._enrolling
            and rec.worker_id is not None
            and hmac.compare_digest(rec.worker_id, enrolled_worker_id(rec.id, enrolment))
        )

    def _used(self, rec: TokenRecord) -> None:
        """Note a use: in memory every time, in the store at most once a ``LAST_USED_EVERY``
        per token (queued, no await: a busy worker's token costs one row a minute, not one
        a request)."""
        now = self.clock()
        if rec.last_used is None or now - rec.last_used >= LAST_USED_EVERY:
            self._records[rec.id] = replace(rec, last_used=now)
            self.store.queue_token_use(rec.id, now)

    def identity_of(self, rec: TokenRecord) -> Identity:
        if self.users is not None:
            return self.users.identity_of(rec)
        return Identity(rec.owner or ADMIN_USER, Role(rec.role or Role.ADMIN))

    @contextlib.asynccontextmanager
    async def spending(self, principal: Principal) -> AsyncIterator[None]:
        """Spend a single-use (instance) token on the block's success; other kinds pass through.

        ``authenticate`` only checks, so a request refused after it (a bad body, a failed
        enrolment) leaves the token usable. The token is marked used before the block runs
        (memory and store), so a concurrent second use is refused and a crash inside the block
        never leaves it spendable twice; an error in the block gives it back. With an enrolment
        nonce, the worker id it makes is stored with the spend (``enrolled_worker_id``): the
        same enrolment sent again after its answer was lost may spend it again, nobody else.
        """
        if principal.kind != TokenKind.INSTANCE:
            yield
            return
        token_id = principal.token_id
        rec = self._records[token_id]
        replay = rec.used and not self._retried(rec, principal.enrolment)
        if token_id in self._enrolling or replay:
            raise _replayed(token_id)  # another request spent it after this one was checked
        spent = replace(rec, used=True)
        if principal.enrolment is not None:
            spent = replace(spent, worker_id=principal.worker_id)
        self._records[token_id] = spent  # before the first await
        self._enrolling.add(token_id)
        try:
            await self.store.save_token(spent)
            yield
        except BaseException:
            # Revoked meanwhile stays revoked: only the spend is undone.
            self._records[token_id] = replace(
                self._records[token_id], used=rec.used, worker_id=rec.worker_id
            )
            await self.store.save_token(self._records[token_id])
            raise
        finally:
            self._enrolling.discard(token_id)

    # -- administration --------------------------------------------------------------------------

    def list(self, *, include_inactive: bool = False) -> list[TokenRecord]:
        now = self.clock()
        recs = sorted(self._records.values(), key=lambda r: (r.created_at, r.id))
        if include_inactive:
            return recs
        return [r for r in recs if token_state(r, now) == "active"]

    def get(self, token_id: str) -> TokenRecord:
        rec = self._records.get(token_id)
        if rec is None:
            raise NotFound(
                f"no token {token_id!r}",
                hint="list tokens with `gpulayer token list`",
                code="token_not_found",
            )
        return rec

    async def revoke(self, token_id: str) -> TokenRecord:
        rec = self.get(token_id)
        if not rec.revoked:
            rec = replace(rec, revoked=True)
            self._records[token_id] = rec
            await self.store.save_token(rec)
        return rec

    async def revoke_where(self, predicate: Callable[[TokenRecord], bool]) -> int:
        hits = [
            replace(r, revoked=True)
            for r in self._records.values()
            if not r.revoked and predicate(r)
        ]
        for rec in hits:
            self._records[rec.id] = rec
            await self.store.save_token(rec)
        return len(hits)

    # -- on behalf of a caller (the API) -----------------------------------------------------------

    async def create_for(
        self,
        who: Identity | None,
        kind: TokenKind | str,
        *,
        ttl: float | None = None,
        name: str = "",
        owner: str | None = None,
        role: Role | str | None = None,
    ) -> tuple[TokenRecord, str]:
        """A token made by ``who``: an admin makes any (a client token for any user, with at
        most that user's role); a user only client tokens of its own, with at most its role."""
        me = resolved(who)
        kind = TokenKind(kind)
        if kind != TokenKind.CLIENT:
            check_role(who, Role.ADMIN, f"create {kind.value} tokens")
            return await self._audited(who, await self.create(kind, ttl=ttl, name=name))
        check_role(who, Role.USER, "create tokens")
        owner = owner or me.user
        if owner != me.user:
            check_role(who, Role.ADMIN, f"create tokens for {owner}")
        ceiling = me.role if owner == me.user else self._user_role(owner)
        if role is None and owner == me.user and me.role is not self._user_role(owner):
            role = me.role  # a token made with a lowered token is no higher than it
        if role is not None and not ceiling.at_least(Role(role)):
            raise Forbidden(
                f"a token of {owner} cannot have the {Role(role).value} role: "
                f"{owner} acts as {ceiling.value}",
                hint="give the token the user's role or a lower one, or change the user's "
                "role first (`gpulayer user set NAME --role ROLE`)",
                code="role_too_high",
            )
        made = await self.create(kind, ttl=ttl, name=name, owner=owner, role=role)
        return await self._audited(who, made)

    async def _audited(
        self, who: Identity | None, made: tuple[TokenRecord, str]
    ) -> tuple[TokenRecord, str]:
        rec = made[0]
        if self.audit is not None:
            await self.audit(
                who, "token.create", rec.id, kind=rec.kind, name=rec.name, user=rec.owner
            )
        return made

    def _user_role(self, name: str) -> Role:
        if self.users is None or (name == ADMIN_USER and self.users.find(name) is None):
            return Role.ADMIN
        return Role(self.users.get(name).role)

    def list_for(
        self, who: Identity | None, *, include_inactive: bool = False
    ) -> builtins.list[TokenRecord]:
        """An admin sees every token; a user its own client tokens; a viewer none."""
        me = resolved(who)
        recs = self.list(include_inactive=include_inactive)
        if me.is_admin:
            return recs
        check_role(who, Role.USER, "list tokens")
        return [r for r in recs if r.kind == TokenKind.CLIENT and r.owner == me.user]

    async def revoke_for(self, who: Identity | None, token_id: str) -> TokenRecord:
        me = resolved(who)
        rec = self.get(token_id)
        if not me.is_admin:
            check_role(who, Role.USER, "revoke tokens")
            if rec.kind != TokenKind.CLIENT or rec.owner != me.user:
                raise not_yours(f"token {token_id}", code="not_your_token")
        revoked = await self.revoke(token_id)
        if self.audit is not None:
            await self.audit(who, "token.revoke", token_id, kind=rec.kind, user=rec.owner)
        return revoked
