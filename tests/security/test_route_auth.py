"""Every route × every bad credential: the right 401/403, and nothing changes.

The routes come from ``gpulayer_kernel.api.operations()`` (the same table that builds the server
and openapi.json), so a new route is tested here without anyone adding it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpulayer_kernel.api import Op, operations
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.security import TokenKind, token_state
from gpulayer_kernel.store import TokenRecord
from gpulayer_kernel.testing import until

from ..api.conftest import Api, sha, start_api, stop_api

# Deliberately unauthenticated: the container healthcheck's and the load balancer's routes, and
# nothing else. A new ``@op(public=True)`` fails test_only_the_declared_routes_are_public until
# it is added here.
PUBLIC = {("/health", "get"), ("/ready", "get")}
OPS = [o for o in operations() if (o.template, o.method) not in PUBLIC]
ALL_KINDS = tuple(TokenKind)
# The kinds stored as rows, which expire and are revoked; a job token is derived and ends with
# its job ("ended job" below).
STORED_KINDS = tuple(k for k in TokenKind if k != TokenKind.JOB)
ENDED_JOB = "0123456789ab"  # a job id this control plane never ran


@dataclass
class World:
    api: Api
    job_a: str  # placed on worker A
    worker_a: str
    worker_b: str
    digest: str
    tokens: dict[str, str]  # case name -> token text


async def snapshot(api: Api) -> Any:
    cp = api.cp
    jobs = [j.model_dump() for j in await cp.list(limit=10_000)]
    workers = [w.model_dump() for w in await cp.workers()]
    tokens = [
        (t.id, t.revoked, t.used, t.worker_id) for t in api.tokens.list(include_inactive=True)
    ]
    events = (await cp.events(0)).next_since
    logs = [(await cp.logs(j["id"], limit=5000)).next_since for j in jobs]
    return jobs, workers, tokens, events, logs, await cp.secret_names()


async def make_world(tmp_path: Path) -> AsyncIterator[World]:
    api = await start_api(tmp_path, heartbeat_timeout=600)
    try:
        wa, session_a = await api.join("wa")
        wb, session_b = await api.join("wb")
        job = await api.cp.submit(
            JobSpec(workload=CommandWorkload(argv=["true"]), resources=Resources(worker="wa"))
        )

        async def placed() -> bool:
            return (await api.cp.get(job.id)).state == JobState.PLACED

        await until(placed, what="the job to be placed on worker A")
        digest = await api.cp.put_blob(b"some artifact")
        await api.cp.set_secret("API_KEY", "value-of-the-key")
        t: dict[str, str] = {
            TokenKind.CLIENT.value: api.client_token,
            TokenKind.JOIN.value: api.join_token,
            TokenKind.WORKER.value: session_a,
            TokenKind.INSTANCE.value: await api.new_token("instance"),
            TokenKind.JOB.value: await api.tokens.issue_job_token(job.id),
            "other-worker": session_b,
        }
        expiring: list[TokenRecord] = []
        t["ended-job"] = await api.tokens.issue_job_token(ENDED_JOB)
        for kind in STORED_KINDS:
            if kind == TokenKind.WORKER:
                rec, text = await api.tokens.create(kind, ttl=0.05, worker_id=wa)
            else:
                rec, text = await api.tokens.create(kind, ttl=0.05)
            t[f"expired-{kind.value}"] = text
            expiring.append(rec)
            if kind == TokenKind.WORKER:
                rec, text = await api.tokens.create(kind, worker_id=wa)
            else:
                rec, text = await api.tokens.create(kind)
            await api.tokens.revoke(rec.id)
            t[f"revoked-{kind.value}"] = text
        used = await api.new_token("instance")
        r = await api.call("POST", "/workers/join", used, json={"name": "wi"})
        assert r.status_code == 200
        t["replayed-instance"] = used
        await until(
            lambda: all(token_state(r, api.tokens.clock()) == "expired" for r in expiring),
            what="the ttl=0.05 tokens to expire",
        )
        yield World(api, job.id, wa, wb, digest, t)
    finally:
        await stop_api(api)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """One world for the whole matrix: each case checks that it changed nothing."""
    async for w in make_world(tmp_path_factory.mktemp("auth")):
        yield w


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async for w in make_world(tmp_path):
        yield w


def fill(template: str, w: World) -> str:
    values = {
        "job_id": w.job_a,
        "digest": w.digest,
        "worker_id": w.worker_a,
        "name": "API_KEY",
        "kind": "user",
        "token_id": w.api.join_token.split("_")[2],
        "session": w.job_a,
        "number": "1",
        "kernel": w.job_a,
    }
    return re.sub(r"\{(\w+)(?::path)?\}", lambda m: values[m.group(1)], template)


def body_for(spec: Op) -> dict[str, Any]:
    if spec.body in ("bytes", "raw"):
        return {"content": b"some artifact"}
    if spec.body is None:
        return {}
    return {
        "json": {
            "name": "x",
            "kind": "client",
            "state": "ready",
            "value": "v",
            "lines": [],
            "fields": {},
            "master_addr": "127.0.0.1",
            "master_port": 1234,
            "workload": {"kind": "command", "argv": ["true"]},
        }
    }


def accepted(spec: Op) -> frozenset[TokenKind]:
    # User routes take client tokens, and the token of a job while it lives (ADR 0022).
    return spec.kinds if spec.kinds is not None else frozenset({TokenKind.CLIENT, TokenKind.JOB})


def cases(spec: Op, template: str) -> list[tuple[str, str | None, int]]:
    """(case, token, expected status) for one operation."""
    ok = accepted(spec)
    out: list[tuple[str, str | None, int]] = [
        ("missing", None, 401),
        ("malformed", "not-a-token", 401),
        ("forged secret", "glt_c_{id}_" + "A" * 43, 401),
        ("forged kind letter", "swap-kind", 401),
    ]
    for kind in ALL_KINDS:
        if kind not in ok:
            out.append((f"wrong kind: {kind.value}", kind.value, 403))
    for kind in STORED_KINDS:
        out.append((f"expired {kind.value}", f"expired-{kind.value}", 401))
        out.append((f"revoked {kind.value}", f"revoked-{kind.value}", 401))
    out.append(("ended job", "ended-job", 401 if TokenKind.JOB in ok else 403))
    out.append(("replayed instance", "replayed-instance", 401 if TokenKind.INSTANCE in ok else 403))
    if template.startswith("/worker/jobs/") or template == "/worker/blobs/{digest}":
        out.append(("another worker's session", "other-worker", 403))
    return out


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("template", "method"),
    [(t, m) for t, m, _, _ in OPS],
    ids=[f"{m.upper()} {t}" for t, m, _, _ in OPS],
)
async def test_bad_credentials_are_refused_and_change_nothing(
    shared_world: World, template: str, method: str
) -> None:
    world = shared_world
    spec = next(s for t, m, _, s in OPS if t == template and m == method)
    api = world.api
    path = fill(template, world)
    if method == "put" and template == "/worker/blobs/{digest}":
        path = f"/worker/blobs/{sha(b'some artifact')}"
    before = await snapshot(api)
    for case, token, expected in cases(spec, template):
        if method == "put" and template == "/worker/blobs/{digest}" and case.startswith("another"):
            continue  # any worker may upload an artifact; it is content-addressed
        text = world.tokens.get(token, token) if token else None
        if case == "forged secret":
            text = f"glt_c_{api.client_token.split('_')[2]}_" + "A" * 43
        elif case == "forged kind letter":
            text = api.client_token.replace("glt_c_", "glt_w_", 1)
        r = await api.call(
            method.upper(),
            path,
            text,
            params={"wait": "0"} if "wait" in [p.name for p in spec.query] else None,
            **body_for(spec),
        )
        assert r.status_code == expected, f"{case}: {r.status_code} {r.text}"
        body = r.json() if method != "head" else {"code": "x"}
        assert "code" in body
        if method != "head":
            assert body["code"] in ("unauthorized", "forbidden") or body["code"].startswith(
                ("token_", "wrong_token", "not_your")
            )
        if expected == 401 and method != "head":
            assert r.headers.get("www-authenticate", "").startswith("Bearer")
    assert await snapshot(api) == before


def test_only_the_declared_routes_are_public() -> None:
    public = {(o.template, o.method) for o in operations() if o.op.public}
    assert public == PUBLIC
    assert all(o.op.kinds is None for o in operations() if o.op.public)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_public_route_ignores_every_credential_and_shows_nothing_protected(
    shared_world: World,
) -> None:
    world = shared_world
    before = await snapshot(world.api)
    # /health's `keys` are key ids (issue 32: which keys each server holds, for rotations): the
    # first 8 hex digits of a key's sha256, which open nothing and tell nothing of the key.
    shown = {
        "/health": {"api_version", "status", "version", "role", "problem", "keys"},
        "/ready": {"api_version", "status", "role"},
    }
    for route, fields in shown.items():
        for token in (None, "not-a-token", *world.tokens.values()):
            r = await world.api.call("GET", route, token)
            assert r.status_code == 200, f"{route} {token}: {r.status_code} {r.text}"
            assert set(r.json()) == fields
            assert all(re.fullmatch(r"[0-9a-f]{8}", k) for k in r.json().get("keys", []))
            assert "www-authenticate" not in r.headers
        for method in ("POST", "PUT", "DELETE"):
            r = await world.api.call(method, route, None, json={})
            assert r.status_code == 405, (route, method)
    assert await snapshot(world.api) == before


async def test_checking_a_join_token_spends_nothing(world: World) -> None:
    api = world.api
    instance = await api.new_token("instance")
    for _ in range(2):
        r = await api.call("GET", "/workers/join", instance)
        assert r.status_code == 200 and r.json()["kind"] == "instance", r.text
    r = await api.call("GET", "/workers/join", world.tokens["join"])
    assert r.json()["kind"] == "join" and r.json()["expires_at"] is None
    r = await api.call("GET", "/workers/join", world.tokens["expired-join"])
    assert r.status_code == 401 and r.json()["code"] == "token_expired"
    # Still unspent: it enrols a worker once.
    r = await api.call("POST", "/workers/join", instance, json={"name": "checked"})
    assert r.status_code == 200
    r = await api.call("GET", "/workers/join", instance)
    assert r.status_code == 401 and r.json()["code"] == "token_replayed"


async def test_an_instance_token_used_at_the_wrong_route_is_not_spent(world: World) -> None:
    api = world.api
    token = await api.new_token("instance")
    r = await api.call("GET", "/jobs", token)
    assert r.status_code == 403
    r = await api.call("POST", "/workers/join", token, json={"name": "fresh"})
    assert r.status_code == 200
    r = await api.call("POST", "/workers/join", token, json={"name": "fresh"})
    assert r.status_code == 401 and r.json()["code"] == "token_replayed"


async def test_a_worker_session_reaches_only_its_own_jobs(world: World) -> None:
    api = world.api
    a, b = world.tokens["worker"], world.tokens["other-worker"]
    r = await api.call("POST", f"/worker/jobs/{world.job_a}/started", b)
    assert r.status_code == 403 and r.json()["code"] == "not_your_job"
    r = await api.call("POST", f"/worker/jobs/{world.job_a}/started", a)
    assert r.status_code == 200 and r.json()["state"] == "running"
    r = await api.call(
        "POST", f"/worker/jobs/{world.job_a}/finished", b, json={"state": "succeeded"}
    )
    assert r.status_code == 403
    r = await api.call(
        "POST", f"/worker/jobs/{world.job_a}/finished", a, json={"state": "succeeded", "result": 7}
    )
    assert r.status_code == 200 and r.json()["state"] == "succeeded"
    # Finished: another worker still cannot read it back through a repeated report.
    r = await api.call("POST", f"/worker/jobs/{world.job_a}/finished", b, json={"state": "failed"})
    assert r.status_code == 403
    # Nor can it submit, list or read jobs.
    for method, path in (("POST", "/jobs"), ("GET", "/jobs"), ("GET", f"/jobs/{world.job_a}")):
        r = await api.call(method, path, a, json={"workload": {"kind": "command", "argv": ["x"]}})
        assert r.status_code == 403, path
    # And a client token cannot poll for work.
    r = await api.call("GET", "/worker/work", "client")
    assert r.status_code == 403


async def test_rejoin_rotates_the_session_token(world: World) -> None:
    api = world.api
    old = world.tokens["worker"]
    r = await api.call("POST", "/workers/join", old, json={"name": "wa"})
    assert r.status_code == 200
    assert r.json()["worker"]["id"] == world.worker_a
    new = r.json()["session_token"]
    assert (await api.call("POST", "/worker/heartbeat", old)).status_code == 401
    assert (await api.call("POST", "/worker/heartbeat", new)).status_code == 200
    # A join token never takes a known id, not even under the same name (issue 12, item 8):
    # tests/security/test_join_identity.py.
    r = await api.call(
        "POST", "/workers/join", "join", json={"name": "wa"}, params={"worker_id": world.worker_a}
    )
    assert r.json()["worker"]["id"] != world.worker_a
    r = await api.call(
        "POST",
        "/workers/join",
        "join",
        json={"name": "impostor"},
        params={"worker_id": world.worker_b},
    )
    assert r.json()["worker"]["id"] != world.worker_b
    # Leaving ends the session.
    latest = (
        await api.call(
            "POST",
            "/workers/join",
            "join",
            json={"name": "wa"},
            params={"worker_id": world.worker_a},
        )
    ).json()["session_token"]
    assert (await api.call("POST", "/worker/leave", latest)).status_code == 204
    assert (await api.call("POST", "/worker/heartbeat", latest)).status_code == 401
