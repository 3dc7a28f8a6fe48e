"""Answers and bodies that exist only at the HTTP edge (status, tokens, secrets, joins, errors).

They follow the contract rules (versioned, frozen, unknown fields refused) and appear in
``/api/v1/openapi.json`` beside the contracts of ``gpulayer_kernel.contracts``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..contracts import Contract, WorkerInfo


class ErrorBody(BaseModel):
    """Every error answer: a stable code, a message naming the field at fault, the next step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    message: str
    hint: str = ""
    details: dict[str, Any] = Field(default_factory=dict)


class Status(Contract):
    version: str
    workers: int = Field(description="live workers (`WorkerInfo.live`: not lost, not offline)")
    jobs: dict[str, int] = Field(description="job count per state")


class Health(Contract):
    """``GET /health``: this API answers; nothing a token protects (no workers, no jobs)."""

    status: Literal["ok", "degraded"] = Field(
        "ok", description="degraded: alive, but ``problem`` will matter when it takes over"
    )
    version: str = Field(description="the gpulayer version of the server")
    role: Literal["leader", "standby"] = Field(
        "leader", description="standby: another control plane of the database leads"
    )
    problem: dict[str, Any] | None = Field(
        None, description="{code, message, hint}: what a standby could not take over with"
    )
    keys: list[str] = Field(
        default_factory=list,
        description="the ids of the secrets keys this server holds, the sealing one first (ids "
        "only: the first 8 hex of each key's sha256); compare them across servers during a "
        "rotation",
    )


class Ready(Contract):
    """``GET /ready``: this control plane serves requests (a standby answers 503 not_leader)."""

    status: Literal["ok"] = "ok"
    role: Literal["leader"] = "leader"


class JoinCheck(Contract):
    """``GET /workers/join``: the token would be accepted by a join; nothing was used up."""

    kind: Literal["join", "instance", "worker"]
    token_id: str
    expires_at: float | None = Field(description="unix time; none: never")
    version: str = Field(description="the gpulayer version of the server")


class Explanation(Contract):
    job_id: str
    sentence: str


class WorkerList(Contract):
    workers: list[WorkerInfo]


class WorkerStateChange(Contract):
    state: Literal["ready", "cordoned", "draining"]


class JoinAnswer(Contract):
    """What a worker gets when it joins: its record and its session token (shown once)."""

    worker: WorkerInfo
    session_token: str
    heartbeat_interval: float = Field(description="seconds between heartbeats this server wants")
    max_wait: float = Field(description="the longest long-poll this server accepts, seconds")
    protocol: str = Field(
        "1.0",
        description="the protocol this server speaks (absent from servers before 1.1): a 1.1 "
        "worker reports through POST /worker/reports",
    )


class LogAck(Contract):
    seq: int = Field(description="sequence number of the last stored line")


RoleName = Literal["admin", "user", "viewer"]
USER_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"


class TokenRequest(Contract):
    kind: Literal["client", "join", "instance"] = Field(
        description="worker session tokens are issued only by joining"
    )
    ttl: float | None = Field(None, gt=0, le=10 * 365 * 86400, description="seconds; none: never")
    name: str = Field("", max_length=100, pattern=r"^[A-Za-z0-9 ._@-]*$")
    user: str | None = Field(
        None, pattern=USER_NAME, description="client tokens: whose (default: the caller's own)"
    )
    role: RoleName | None = Field(
        None, description="client tokens: act with this role, at most the user's (default: it)"
    )


class TokenInfo(Contract):
    """A token as listed: never its secret."""

    id: str
    kind: Literal["client", "join", "worker", "instance"]
    name: str
    created_at: float
    expires_at: float | None
    state: Literal["active", "revoked", "expired", "used"]
    worker_id: str | None = None
    user: str | None = Field(None, description="client tokens: the user it belongs to")
    role: RoleName | None = Field(None, description="client tokens: a role lower than the user's")
    last_used: float | None = Field(
        None, description="when it last authenticated (to the minute); None: never"
    )


class TokenCreated(Contract):
    token: TokenInfo
    secret: str = Field(description="the token itself; shown this once, stored only as a hash")


class TokenList(Contract):
    tokens: list[TokenInfo]


class SecretValue(Contract):
    value: str = Field(min_length=1, max_length=64 * 1024)


class SecretNames(Contract):
    names: list[str]
    user: str | None = Field(None, description="whose secrets these are")
    entries: list[str] | None = Field(
        None, description="with `all=1` (admins): every user's, as `user/NAME`"
    )


class KeyRotated(Contract):
    key_id: str = Field(description="the id of the key that seals new values now")
    step: Literal["all", "add", "reseal", "retire"] = "all"
    keys: list[str] = Field(default_factory=list, description="the key ids held, sealing first")
    source: str = Field("", description="where the keys live: the key file to copy, or a source")
    writable: bool = Field(False, description="the source is a key file GPUlayer writes")
    added: str | None = Field(None, description="the key the add step made")
    retired: list[str] = Field(default_factory=list, description="keys the retire step dropped")


class UserInfo(Contract):
    name: str
    role: RoleName
    group: str | None = None
    disabled: bool = False
    created_at: float


class UserList(Contract):
    users: list[UserInfo]


class UserRequest(Contract):
    name: str = Field(pattern=USER_NAME)
    role: RoleName = "user"
    group: str | None = Field(None, pattern=USER_NAME)


class UserChange(Contract):
    role: RoleName | None = None
    group: str | None = Field(None, pattern=r"^$|" + USER_NAME[1:], description='"": no group')
    disabled: bool | None = None


class QuotaInfo(Contract):
    subject: str = Field(description="`user:<name>` or `group:<name>`")
    max_gpus: int | None = Field(None, ge=0, description="GPUs held at once by running jobs")
    max_queued: int | None = Field(None, ge=0, description="jobs waiting at once")


class QuotaList(Contract):
    quotas: list[QuotaInfo]


class QuotaRequest(Contract):
    max_gpus: int | None = Field(None, ge=0, le=1_000_000)
    max_queued: int | None = Field(None, ge=0, le=1_000_000)


class WhoAmI(Contract):
    """The caller as the control plane sees it: user, role, group and the quotas that apply."""

    user: str
    role: RoleName
    group: str | None = None
    quotas: list[QuotaInfo] = Field(default_factory=list)


class BlobStored(Contract):
    digest: str
    size: int
