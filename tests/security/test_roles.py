"""Roles over HTTP: every user route × every role, and user A on user B's work — refused, and
nothing changed. The routes come from ``operations()``, so a new route is covered here at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from gpulayer_kernel.api import operations
from gpulayer_kernel.contracts import CommandWorkload, JobSpec
from gpulayer_kernel.security import Role, TokenKind

from ..api.conftest import Api, sha, start_api, stop_api
from .test_route_auth import body_for, fill, snapshot

# User routes (the public health route takes no token at all: it has its own tests).
USER_OPS = [
    (t, m, spec) for t, m, _, spec in operations() if spec.kinds is None and not spec.public
]
RANK = {Role.VIEWER: 0, Role.USER: 1, Role.ADMIN: 2}


@dataclass
class Team:
    api: Api
    tokens: dict[str, str]  # alice, bob (users), vera (viewer), admin, off (disabled user)
    bob_job: str
    bob_blob: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def team(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Team]:
    api = await start_api(tmp_path_factory.mktemp("team"), heartbeat_timeout=600)
    try:
        users = api.cp.users
        for name, role in (("alice", Role.USER), ("bob", Role.USER), ("vera", Role.VIEWER)):
            await users.add(name, role)
        await users.add("off", Role.USER)
        tokens = {"admin": api.client_token}
        for name in ("alice", "bob", "vera", "off"):
            _, tokens[name] = await api.tokens.create(TokenKind.CLIENT, owner=name)
        _, tokens["alice-as-viewer"] = await api.tokens.create(
            TokenKind.CLIENT, owner="alice", role=Role.VIEWER
        )
        await users.update("off", disabled=True)
        r = await api.call(
            "PUT", f"/bundles/{sha(b'bob code')}", tokens["bob"], content=b"bob code"
        )
        assert r.status_code == 201, r.text
        bob = Api(**{**api.__dict__, "client_token": tokens["bob"]})
        r = await bob.call(
            "POST", "/jobs", json={"workload": {"kind": "command", "argv": ["true"]}}
        )
        assert r.status_code == 201, r.text
        await api.cp.set_secret("API_KEY", "bobs-value-1234", user="bob")
        yield Team(api, tokens, r.json()["id"], sha(b"bob code"))
    finally:
        await stop_api(api)


def least_role(spec: object) -> Role:
    role = getattr(spec, "role", None)
    assert isinstance(role, Role), "every user route declares its least role"
    return role


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("template", "method"),
    [(t, m) for t, m, _ in USER_OPS],
    ids=[f"{m.upper()} {t}" for t, m, _ in USER_OPS],
)
async def test_a_role_below_the_route_s_is_refused_and_changes_nothing(
    team: Team, template: str, method: str
) -> None:
    spec = next(s for t, m, s in USER_OPS if t == template and m == method)
    need = least_role(spec)
    api = team.api
    path = fill(template, _World(team))  # type: ignore[arg-type]
    before = await snapshot(api)
    for who, role in (
        ("vera", Role.VIEWER),
        ("alice-as-viewer", Role.VIEWER),
        ("alice", Role.USER),
    ):
        if RANK[role] >= RANK[need]:
            continue
        r = await api.call(
            method.upper(), path, team.tokens[who], params={"wait": "0"}, **body_for(spec)
        )
        assert r.status_code == 403, f"{who} on {method} {template}: {r.status_code} {r.text}"
        if method != "head":
            assert r.json()["code"] == "role_forbidden"
    # A disabled user's token is refused everywhere, whatever the route.
    r = await api.call(method.upper(), path, team.tokens["off"], **body_for(spec))
    assert r.status_code == 401
    if method != "head":
        assert r.json()["code"] == "user_disabled"
    assert await snapshot(api) == before


class _World:
    """What ``fill`` reads: bob's job, blob and secret as the targets."""

    def __init__(self, team: Team) -> None:
        self.job_a = team.bob_job
        self.digest = team.bob_blob
        self.worker_a = "no-such-worker"
        self.api = team.api
        self.tokens = team.tokens

    def __getattr__(self, name: str) -> str:  # pragma: no cover - fill reads only the above
        raise AttributeError(name)


BOBS_WORK = [
    ("GET", "/jobs/{job}"),
    ("GET", "/jobs/{job}/logs"),
    ("GET", "/jobs/{job}/wait"),
    ("GET", "/jobs/{job}/explain"),
    ("POST", "/jobs/{job}/cancel"),
    ("GET", "/jobs/{job}/artifacts/out.txt"),
    ("GET", "/artifacts/{blob}"),
    ("GET", "/bundles/{blob}"),
    ("HEAD", "/bundles/{blob}"),
]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("method", "template"), BOBS_WORK, ids=[f"{m} {t}" for m, t in BOBS_WORK])
async def test_alice_cannot_see_or_touch_bobs_work(team: Team, method: str, template: str) -> None:
    api = team.api
    path = template.format(job=team.bob_job, blob=team.bob_blob)
    before = await snapshot(api)
    r = await api.call(method, path, team.tokens["alice"], params={"timeout": "0", "wait": "0"})
    assert r.status_code in (403, 404), f"{method} {path}: {r.status_code} {r.text}"
    if method != "HEAD":
        assert r.json()["code"] in ("not_yours", "blob_not_found")
        assert "bob code" not in r.text
    assert await snapshot(api) == before
    # Bob (and an admin) can.
    if template.startswith("/jobs/{job}") and not template.endswith(("cancel", "out.txt")):
        for who in ("bob", "admin", "vera"):
            ok = await api.call(method, path, team.tokens[who], params={"timeout": "0"})
            assert ok.status_code == 200, (who, ok.text)


@pytest.mark.asyncio(loop_scope="module")
async def test_alice_lists_only_her_own_jobs_and_secrets(team: Team) -> None:
    api = team.api
    r = await api.call("GET", "/jobs", team.tokens["alice"])
    assert r.json()["jobs"] == []
    r = await api.call("GET", "/jobs", team.tokens["vera"])
    assert [j["id"] for j in r.json()["jobs"]] == [team.bob_job]  # a viewer reads all
    r = await api.call("GET", "/secrets", team.tokens["alice"])
    assert r.json()["names"] == []
    r = await api.call("GET", "/secrets", team.tokens["alice"], params={"user": "bob"})
    assert r.status_code == 403 and r.json()["code"] == "role_forbidden"
    r = await api.call("DELETE", "/secrets/API_KEY", team.tokens["alice"])
    assert r.status_code == 404  # her own namespace: bob's secret is untouched
    assert await api.cp.secret_names(user="bob") == ["API_KEY"]
    r = await api.call("GET", "/secrets", team.tokens["admin"], params={"all": "1"})
    assert r.json()["entries"] == ["bob/API_KEY"]
    assert "bobs-value" not in r.text
    r = await api.call("GET", "/tokens", team.tokens["alice"])
    assert {t["user"] for t in r.json()["tokens"]} == {"alice"}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_user_cannot_revoke_the_admin_token_nor_make_more_than_they_are(team: Team) -> None:
    api = team.api
    before = await snapshot(api)
    admin_id = api.client_token.split("_")[2]
    r = await api.call("POST", f"/tokens/{admin_id}/revoke", team.tokens["alice"])
    assert r.status_code == 403 and r.json()["code"] == "not_your_token"
    for body in (
        {"kind": "client", "role": "admin"},
        {"kind": "join"},
        {"kind": "client", "user": "bob"},
    ):
        r = await api.call("POST", "/tokens", team.tokens["alice"], json=body)
        assert r.status_code == 403, (body, r.text)
    assert await snapshot(api) == before
    # Her own token, at her role or lower, she may make and revoke.
    r = await api.call(
        "POST", "/tokens", team.tokens["alice"], json={"kind": "client", "role": "viewer"}
    )
    assert r.status_code == 201 and r.json()["token"]["user"] == "alice"
    mine = r.json()["token"]["id"]
    r = await api.call("POST", f"/tokens/{mine}/revoke", team.tokens["alice"])
    assert r.status_code == 200 and r.json()["state"] == "revoked"


@pytest.mark.asyncio(loop_scope="module")
async def test_whoami_says_who_and_which_quotas(team: Team) -> None:
    api = team.api
    await api.cp.users.set_quota("user:alice", max_gpus=4, max_queued=2)
    r = await api.call("GET", "/whoami", team.tokens["alice-as-viewer"])
    assert r.json()["user"] == "alice" and r.json()["role"] == "viewer"
    assert r.json()["quotas"][0]["max_gpus"] == 4
    spec = JobSpec(workload=CommandWorkload(argv=["true"]), resources={"gpus": 8})  # type: ignore[arg-type]
    r = await api.call("POST", "/jobs", team.tokens["alice"], json=spec.model_dump(mode="json"))
    assert r.status_code == 429 and r.json()["code"] == "quota_exceeded"
    await api.cp.users.set_quota("user:alice")
