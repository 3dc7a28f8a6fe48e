"""The /api/v1 routes through a real tornado server: answers, errors, limits and long-polls."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.api import ApiLimits, build_openapi, operations
from gpulayer_kernel.client.clients import AsyncClient
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, PythonWorkload
from gpulayer_kernel.errors import (
    BundleError,
    InvalidInput,
    NotFound,
    Unauthorized,
    ValidationFailed,
)
from gpulayer_kernel.testing import until

from .conftest import Api, sha, start_api, stop_api

ROOT = Path(__file__).resolve().parents[2]


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


def error_shape(r: httpx.Response) -> dict[str, object]:
    body = r.json()
    assert set(body) == {"code", "message", "hint", "details"}, body
    assert "Traceback" not in r.text
    assert r.headers["content-type"].startswith("application/json")
    return body  # type: ignore[no-any-return]


async def test_status_and_the_client_calls(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        status = await c.status()
        assert status["workers"] == 0 and status["jobs"] == {}
        assert re.match(r"^\d", status["version"])
        job = await c.submit(cmd("true", name="first", labels={"team": "a"}))
        assert job.state == JobState.QUEUED
        assert (await c.get(job.id[:6])).id == job.id
        assert [j.id for j in await c.list(label=("team", "a"))] == [job.id]
        assert await c.list(states=[JobState.RUNNING]) == []
        assert "queued" in await c.explain(job.id) or "0/0" in await c.explain(job.id)
        page = await c.events(0)
        assert page.events and page.events[-1].job is not None
        cancelled = await c.cancel(job.id)
        assert cancelled.state == JobState.CANCELLED
        assert (await c.wait(job.id, timeout=1)).state == JobState.CANCELLED
        logs = await c.logs(job.id)
        assert logs.state == JobState.CANCELLED
        assert (await c.status())["jobs"] == {"cancelled": 1}
        assert await c.workers() == []


async def test_errors_come_back_as_the_same_types(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        with pytest.raises(NotFound) as nf:
            await c.get("abcdef123456")
        assert nf.value.code == "job_not_found"
        with pytest.raises(InvalidInput):
            await c.get("ab")
        with pytest.raises(NotFound) as missing:
            spec = JobSpec(workload=PythonWorkload(bundle="0" * 64, entrypoint="m:f"))
            await c.submit(spec)
        assert missing.value.code == "bundle_not_found"
    async with AsyncClient(gl_api.url, "glt_c_000000000000_nope") as bad:
        with pytest.raises(Unauthorized) as un:
            await bad.status()
        assert un.value.code == "token_invalid"


async def test_malformed_json_and_unknown_fields_name_the_fault(gl_api: Api) -> None:
    r = await gl_api.call("POST", "/jobs", content=b'{"workload": {"argv": ["x"]')
    assert r.status_code == 422 and error_shape(r)["code"] == "validation_failed"
    r = await gl_api.call(
        "POST", "/jobs", json={"workload": {"kind": "command", "argv": ["x"]}, "gpu": 1}
    )
    body = error_shape(r)
    assert r.status_code == 422 and "gpu: unknown field" in str(body["message"])
    r = await gl_api.call(
        "POST",
        "/jobs",
        json={"workload": {"kind": "command", "argv": ["x"]}, "resources": {"gpus": -1}},
    )
    assert r.status_code == 422 and "resources.gpus" in str(error_shape(r)["message"])
    r = await gl_api.call("GET", "/jobs", params={"limit": "lots"})
    assert r.status_code == 400 and error_shape(r)["code"] == "bad_parameter"
    r = await gl_api.call("GET", "/jobs", params={"state": "sleeping"})
    assert r.status_code == 400 and "state" in str(error_shape(r)["message"])
    r = await gl_api.call("GET", "/events", params={"wait": "1e9"})
    assert r.status_code == 400 and error_shape(r)["details"] == {"parameter": "wait"}


async def test_unknown_routes_and_methods_are_json(gl_api: Api) -> None:
    r = await gl_api.call("GET", "/nope")
    assert r.status_code == 404 and error_shape(r)["code"] == "not_found"
    r = await gl_api.http.get(gl_api.url + "/")
    assert r.status_code == 404 and error_shape(r)["code"] == "not_found"
    r = await gl_api.call("DELETE", "/jobs")
    assert r.status_code == 405 and error_shape(r)["code"] == "method_not_allowed"


async def test_an_unexpected_exception_is_a_500_without_traceback(
    gl_api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(**_: object) -> list[object]:
        raise RuntimeError("kaboom at line 42")

    monkeypatch.setattr(gl_api.cp, "workers", boom)
    r = await gl_api.call("GET", "/workers")
    body = error_shape(r)
    assert r.status_code == 500 and body["code"] == "internal"
    assert "kaboom" not in r.text and "line 42" not in r.text
    # The server log has it, for the operator.
    assert any("kaboom" in str(rec.exc_info) for rec in caplog.records if rec.exc_info)


async def test_bodies_over_the_limit_get_413_and_the_connection_survives(
    tmp_path: Path,
) -> None:
    api = await start_api(
        tmp_path,
        limits=ApiLimits(max_json=4096, max_blob=64 << 10, max_bundle=64 << 10, drain_max=1 << 20),
    )
    try:
        big = {"workload": {"kind": "command", "argv": ["echo", "x" * 10_000]}}
        r = await api.call("POST", "/jobs", json=big)
        assert r.status_code == 413 and error_shape(r)["code"] == "body_too_large"
        # A body beyond the drain limit is refused too (the connection is then closed).
        r = await api.call("PUT", "/bundles/" + "a" * 64, content=b"x" * (2 << 20))
        assert r.status_code == 413
        # Chunked (no Content-Length) is counted as it arrives.

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(10):
                yield b"y" * 1000

        r = await api.http.post(
            api.base + "/jobs",
            content=chunks(),
            headers={"Authorization": f"Bearer {api.client_token}"},
        )
        assert r.status_code == 413
        r = await api.call("GET", "/status")
        assert r.status_code == 200
        # Blobs have their own (larger) limit.
        data = b"z" * 30_000
        r = await api.call("PUT", f"/bundles/{sha(data)}", content=data)
        assert r.status_code == 201, r.text
    finally:
        await stop_api(api)


async def test_bundle_upload_is_verified_against_its_digest(gl_api: Api) -> None:
    digest, data = bundles.build({"main.py": b"print('hi')\n"})
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        assert not await c.has_bundle(digest)
        with pytest.raises(BundleError) as bad:
            await c.put_bundle(b"not the bundle", digest)
        assert bad.value.code == "bundle_invalid"
        assert not await c.has_bundle(digest)
        assert await c.put_bundle(data) == digest
        assert await c.has_bundle(digest)
        assert await c.get_blob(digest) == data
        assert await c.get_bundle(digest) == data
        with pytest.raises(InvalidInput):
            await c.get_blob("../../etc/passwd")
    r = await gl_api.call("HEAD", "/bundles/" + "f" * 64)
    assert r.status_code == 404


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "a/../../b", "..", "a\\..\\b"])
async def test_artifact_names_cannot_traverse(gl_api: Api, name: str) -> None:
    job = await gl_api.cp.submit(cmd("true"))
    # Percent-encode even the dots: a client would otherwise normalise "/.." away itself.
    encoded = "".join(f"%{b:02X}" for b in name.encode())
    r = await gl_api.call("GET", f"/jobs/{job.id}/artifacts/{encoded}")
    assert r.status_code == 400, r.text
    assert error_shape(r)["code"] == "bad_artifact_name"


async def test_tokens_in_urls_are_refused_and_never_logged(
    gl_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    r = await gl_api.call("GET", "/jobs", params={"token": gl_api.client_token})
    assert r.status_code == 400 and error_shape(r)["code"] == "token_in_url"
    await gl_api.call("GET", f"/jobs/{gl_api.client_token}")
    await gl_api.call("GET", "/status", gl_api.client_token + "x")
    secret = gl_api.client_token.split("_", 3)[3]  # glt_<k>_<id>_<secret>; it may hold "_"
    server = [r for r in caplog.records if r.name.startswith(("gpulayer", "tornado"))]
    assert server and all(secret not in rec.getMessage() for rec in server)


async def test_long_poll_answers_the_moment_something_happens(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        cursor = await c.event_cursor()
        t0 = time.monotonic()
        poll = asyncio.create_task(c.events(cursor=cursor, wait=20))
        await until(lambda: gl_api.server.context.polls == 1, what="the server to hold the poll")
        assert not poll.done()
        await gl_api.cp.submit(cmd("true"))
        page = await asyncio.wait_for(poll, 5)
        assert page.events and time.monotonic() - t0 < 5
        assert page.cursor != cursor and not page.reset


async def test_events_follow_a_cursor_and_see_a_restart(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        first = await c.submit(cmd("true", name="before"))
        cursor = await c.event_cursor()  # from now: "before" is behind it
        assert cursor == (await gl_api.call("GET", "/events/cursor")).json()["cursor"]
        second = await c.submit(cmd("true", name="after"))
        page = await c.events(cursor=cursor)
        jobs = {e.job.id for e in page.events if e.job is not None}
        assert second.id in jobs and first.id not in jobs and not page.reset
        assert (await c.events(cursor=page.cursor)).events == []
        # Older clients follow sequence numbers; the same events come back.
        old = await c.events(since=0)
        assert first.id in {e.job.id for e in old.events if e.job is not None}
        # A cursor from another epoch (a control plane since restarted) says so.
        epoch, _, seq = cursor.rpartition(":")
        stale = await c.events(cursor=f"{epoch}0:{seq}")
        assert stale.reset and stale.cursor.rpartition(":")[0] == epoch
    r = await gl_api.call("GET", "/events", params={"cursor": "9" * 100})
    assert r.status_code == 400 and error_shape(r)["details"] == {"parameter": "cursor"}


async def test_a_client_leaving_ends_its_long_poll(gl_api: Api) -> None:
    ctx = gl_api.server.context
    job = await gl_api.cp.submit(cmd("true"))

    async def scheduled() -> bool:  # its scheduling pass has run
        return (await gl_api.cp.get(job.id)).pending is not None

    await until(scheduled, what="the job's first scheduling pass")
    now = await gl_api.cp.event_cursor()  # nothing after it yet: the poll waits
    polls = [
        asyncio.create_task(gl_api.call("GET", "/events", params={"cursor": now, "wait": 50})),
        asyncio.create_task(gl_api.call("GET", f"/jobs/{job.id}/logs", params={"wait": 50})),
    ]
    await until(lambda: ctx.polls == 2, 2, what="both long-polls to be held")
    for p in polls:
        p.cancel()
    await asyncio.gather(*polls, return_exceptions=True)
    await gl_api.http.aclose()  # closes the connections: the server notices
    await until(lambda: ctx.polls == 0, 4, what="the server to end both polls")
    gl_api.http = httpx.AsyncClient(trust_env=False)


async def test_stopping_the_server_ends_long_polls(tmp_path: Path) -> None:
    api = await start_api(tmp_path)
    try:
        job = await api.cp.submit(cmd("true"))
        poll = asyncio.create_task(api.call("GET", f"/jobs/{job.id}/wait", params={"timeout": 50}))
        await until(lambda: api.server.context.polls, 2, what="the server to hold the poll")
        t0 = time.monotonic()
        await api.server.stop()
        r = await asyncio.wait_for(poll, 5)
        assert r.status_code == 503 and error_shape(r)["code"] == "shutting_down"
        assert time.monotonic() - t0 < 3
    finally:
        await stop_api(api)


async def test_secrets_are_write_only(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        await c.set_secret("HF_TOKEN", "hf_supersecretvalue")
        assert await c.secret_names() == ["HF_TOKEN"]
        with pytest.raises(ValidationFailed):
            await c.set_secret("not-a-name", "x")
        assert await c.delete_secret("HF_TOKEN")
        assert not await c.delete_secret("HF_TOKEN")
    r = await gl_api.call("GET", "/secrets/HF_TOKEN")
    assert r.status_code == 405


async def test_token_admin_over_http(gl_api: Api) -> None:
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        info, secret = await c.create_token("join", ttl=60, name="for-ci")
        assert secret.startswith("glt_j_") and info["state"] == "active"
        assert info["expires_at"] is not None
        listed = await c.list_tokens()
        assert info["id"] in {t["id"] for t in listed}
        assert all("secret" not in t and "hash" not in t for t in listed)
        assert secret not in str(listed)
        revoked = await c.revoke_token(info["id"])
        assert revoked["state"] == "revoked"
        assert info["id"] not in {t["id"] for t in await c.list_tokens()}
        assert info["id"] in {t["id"] for t in await c.list_tokens(include_inactive=True)}
        with pytest.raises(ValidationFailed):
            await c.create_token("worker")
    r = await gl_api.call("POST", "/workers/join", secret, json={"name": "w"})
    assert r.status_code == 401 and error_shape(r)["code"] == "token_revoked"


async def test_worker_state_and_unknown_worker(gl_api: Api) -> None:
    wid, _ = await gl_api.join("w1")
    async with AsyncClient(gl_api.url, gl_api.client_token) as c:
        w = await c.set_worker_state(wid, "cordoned")
        assert w.state == "cordoned"
        with pytest.raises(NotFound):
            await c.set_worker_state("nope", "ready")
        with pytest.raises(ValidationFailed):
            await c.set_worker_state(wid, "lost")


def test_openapi_covers_every_route_and_the_route_table_doc() -> None:
    doc = build_openapi(operations())
    ops = operations()
    assert sum(len(v) for v in doc["paths"].values()) == len(ops)
    table = (ROOT / "docs" / "api-routes.md").read_text()
    for template, method, _, _ in ops:
        path = re.sub(r"\{(\w+)(?::path)?\}", r"{\1}", template)
        documented = re.sub(r"\{\w+\}", "{}", path)
        doc_paths = {re.sub(r"\{\w+\}", "{}", p) for p in re.findall(r"`(/[^`?\[]*)", table)}
        assert documented in doc_paths, f"{method.upper()} {path} is not in docs/api-routes.md"
    schemas = doc["components"]["schemas"]
    assert {"JobSpec", "ErrorBody", "WorkerRegistration", "TokenCreated"} <= set(schemas)


async def test_openapi_json_is_served(gl_api: Api) -> None:
    r = await gl_api.call("GET", "/openapi.json")
    assert r.status_code == 200
    assert r.json()["openapi"] == "3.1.0"
    assert r.json()["servers"] == [{"url": "/api/v1"}]
    assert r.json()["paths"] == build_openapi(operations())["paths"]
    assert "/events/cursor" in r.json()["paths"]


@pytest.mark.slow
def test_the_benchmark_smoke_runs() -> None:
    import subprocess

    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_http.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"throughput: \d+ jobs/s", r.stdout.strip().splitlines()[-1])
