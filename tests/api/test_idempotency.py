"""Idempotency-Key over HTTP (ADR 0003), against a real server and a real SQLite store.

Every keyed route: the same key and body is done once and its answer replayed (``POST /jobs``,
``/jobs/run``, ``/jobs/batch``, cancel, session start, cells); another body is 409; another user's
same key is their own; a key after its window is new; a malformed key is 400 naming the header;
a retry while the first try is in flight waits for it; a record cut off by a restart is resolved
to the job or cell it made. The kill -9 of a real server is in
tests/test_client_retry.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.api import ApiLimits
from gpulayer_kernel.api.idempotency import fingerprint
from gpulayer_kernel.contracts import JobSpec, WorkerRegistration
from gpulayer_kernel.security import Role, TokenKind
from gpulayer_kernel.store import IdempotencyRecord, JobQuery
from gpulayer_kernel.testing import FakeClock, until
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig
from gpulayer_kernel.worker.transport import InProcessTransport

from ..sessions.conftest import up
from .conftest import Api, running_api

SPEC = {"workload": {"kind": "command", "argv": ["true"]}, "name": "once"}
OTHER = {"workload": {"kind": "command", "argv": ["false"]}, "name": "other"}
HOLDER = {"client": "kernel-a", "notebook": "n.ipynb"}


async def post(
    api: Api,
    path: str,
    key: str | None,
    body: Any = None,
    *,
    token: str | None = None,
    params: Any = None,
) -> httpx.Response:
    headers: dict[str, Any] = {"Authorization": f"Bearer {token or api.client_token}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return await api.http.post(
        api.base + path, headers=headers, json=body, params=params, timeout=30.0
    )


async def jobs_in_store(api: Api) -> int:
    return len(await api.store.list_jobs(JobQuery(limit=10_000)))


@pytest.fixture
async def short_window(tmp_path: Path, gl_fake_clock: FakeClock) -> AsyncIterator[Api]:
    async with running_api(
        tmp_path, limits=ApiLimits(idempotency_window=0.5), clock=gl_fake_clock
    ) as api:
        yield api


async def test_the_same_key_and_body_makes_one_job_and_replays_its_answer(gl_api: Api) -> None:
    first = await post(gl_api, "/jobs", "k-1", SPEC)
    assert first.status_code == 201, first.text
    assert "Idempotency-Replayed" not in first.headers
    # The same JSON spelled otherwise (key order, spacing) is the same request.
    again = await gl_api.http.post(
        gl_api.base + "/jobs",
        content=json.dumps(dict(reversed(SPEC.items())), indent=2),
        headers={"Authorization": f"Bearer {gl_api.client_token}", "Idempotency-Key": "k-1"},
    )
    assert again.status_code == 201
    assert again.headers["Idempotency-Replayed"] == "true"
    assert again.json() == first.json()
    assert await jobs_in_store(gl_api) == 1
    # Without a key nothing changes: each POST is its own job.
    assert (await post(gl_api, "/jobs", None, SPEC)).status_code == 201
    assert await jobs_in_store(gl_api) == 2


async def test_the_same_key_with_another_body_or_route_is_409(gl_api: Api) -> None:
    assert (await post(gl_api, "/jobs", "k-2", SPEC)).status_code == 201
    for path, body in (("/jobs", OTHER), ("/jobs/batch", {"specs": [SPEC]})):
        r = await post(gl_api, path, "k-2", body)
        assert r.status_code == 409, r.text
        assert r.json()["code"] == "idempotency_key_reused"
        assert r.json()["details"]["header"] == "Idempotency-Key"
    assert await jobs_in_store(gl_api) == 1


async def test_another_user_s_same_key_is_their_own(gl_api: Api) -> None:
    await gl_api.cp.users.add("bob", Role.USER)
    _, bob = await gl_api.tokens.create(TokenKind.CLIENT, owner="bob")
    mine = await post(gl_api, "/jobs", "shared", SPEC)
    theirs = await post(gl_api, "/jobs", "shared", SPEC, token=bob)
    assert theirs.status_code == 201 and "Idempotency-Replayed" not in theirs.headers
    assert theirs.json()["id"] != mine.json()["id"] and theirs.json()["owner"] == "bob"
    # ... and another body under the same key is no conflict for them either.
    assert (await post(gl_api, "/jobs", "shared", OTHER, token=bob)).status_code == 409
    assert (await post(gl_api, "/jobs", "shared", SPEC, token=bob)).json() == theirs.json()
    assert await jobs_in_store(gl_api) == 2


async def test_a_key_after_its_window_is_new(short_window: Api, gl_fake_clock: FakeClock) -> None:
    api = short_window
    first = await post(api, "/jobs", "k-3", SPEC)
    await gl_fake_clock.advance(0.4)
    assert (await post(api, "/jobs", "k-3", SPEC)).json()["id"] == first.json()["id"]
    await gl_fake_clock.advance(0.2)  # the window (0.5 s of the control plane's clock) is past
    later = await post(api, "/jobs", "k-3", OTHER)  # a new request: no conflict, a new job
    assert later.status_code == 201 and "Idempotency-Replayed" not in later.headers
    assert later.json()["id"] != first.json()["id"]
    assert await jobs_in_store(api) == 2


@pytest.mark.parametrize("key", ["", "x" * 256, "naïve", "a b", "tab\tkey"])
async def test_a_malformed_key_is_400_naming_the_header(gl_api: Api, key: str) -> None:
    r = await gl_api.http.post(
        gl_api.base + "/jobs",
        json=SPEC,
        headers={
            "Authorization": f"Bearer {gl_api.client_token}",
            "Idempotency-Key": key.encode(),  # bytes: sent as they are
        },
    )
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "idempotency_key_invalid"
    assert "Idempotency-Key" in r.json()["message"]
    assert await jobs_in_store(gl_api) == 0


async def test_a_retry_while_the_first_is_in_flight_waits_for_it(gl_api: Api) -> None:
    # No worker: /jobs/run long-polls its whole `wait`; the retry comes meanwhile.
    params = {"wait": "1.5", "linger": "1.5"}
    body = {"spec": SPEC}
    first = asyncio.ensure_future(post(gl_api, "/jobs/run", "k-4", body, params=params))

    async def first_made_its_job() -> bool:  # and long-polls it now
        return await jobs_in_store(gl_api) == 1

    await until(first_made_its_job, 10, what="the first request's job")
    clash = await post(gl_api, "/jobs/run", "k-4", {"spec": OTHER}, params=params)
    assert clash.status_code == 409 and clash.json()["code"] == "idempotency_key_reused"
    assert not first.done()  # refused at once, not after the first one
    second = await post(gl_api, "/jobs/run", "k-4", body, params={"wait": "0", "linger": "0"})
    one = await first
    assert one.status_code == second.status_code == 201
    assert second.headers["Idempotency-Replayed"] == "true"
    assert one.json()["job"]["id"] == second.json()["job"]["id"]
    assert await jobs_in_store(gl_api) == 1


async def test_a_client_that_hung_up_mid_long_poll_gets_the_answer_on_retry(
    gl_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    params = {"wait": "1.5", "linger": "1.5"}
    with pytest.raises(httpx.ReadTimeout):  # the connection is dropped mid-request
        await gl_api.http.post(
            gl_api.base + "/jobs/run",
            json={"spec": SPEC},
            params=params,
            headers={"Authorization": f"Bearer {gl_api.client_token}", "Idempotency-Key": "k-13"},
            timeout=0.3,
        )
    # The first try runs on to its answer; the retry waits for it and gets it.
    again = await post(gl_api, "/jobs/run", "k-13", {"spec": SPEC}, params=params)
    assert again.status_code == 201 and again.headers["Idempotency-Replayed"] == "true"
    assert await jobs_in_store(gl_api) == 1
    # A follow route's status is written as its answer goes (``idempotency.py``, 5.).
    if writing := gl_api.server.context.keys.writing:
        await asyncio.wait(writing)
    rec = await gl_api.store.get_idempotency("admin", "k-13")
    assert rec is not None and rec.status == 201 and rec.jobs == (again.json()["job"]["id"],)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_jobs_batch_is_done_once(gl_api: Api) -> None:
    body = {"specs": [SPEC, OTHER, {"workload": {"kind": "nope"}}]}
    first = await post(gl_api, "/jobs/batch", "k-5", body)
    assert first.status_code == 201, first.text
    again = await post(gl_api, "/jobs/batch", "k-5", body)
    assert again.headers["Idempotency-Replayed"] == "true"
    assert again.json() == first.json() and len(first.json()["jobs"]) == 2
    assert len(first.json()["refused"]) == 1
    assert await jobs_in_store(gl_api) == 2


async def test_cancel_is_answered_once(gl_api: Api) -> None:
    job = (await post(gl_api, "/jobs", None, SPEC)).json()
    first = await post(gl_api, f"/jobs/{job['id']}/cancel", "k-6")
    assert first.status_code == 200 and first.json()["state"] == "cancelled"
    again = await post(gl_api, f"/jobs/{job['id']}/cancel", "k-6")
    assert again.headers["Idempotency-Replayed"] == "true" and again.json() == first.json()
    # The same key on another job's cancel is another request.
    other = (await post(gl_api, "/jobs", None, SPEC)).json()
    clash = await post(gl_api, f"/jobs/{other['id']}/cancel", "k-6")
    assert clash.status_code == 409 and clash.json()["code"] == "idempotency_key_reused"


async def test_a_session_start_and_its_cell_are_done_once(gl_api: Api) -> None:
    spec = {"name": "s1", "holder": HOLDER}
    first = await post(gl_api, "/sessions", "k-7", spec)
    assert first.status_code == 201, first.text
    again = await post(gl_api, "/sessions", "k-7", spec)
    assert again.status_code == 201 and again.headers["Idempotency-Replayed"] == "true"
    assert again.json() == first.json()
    assert len(await gl_api.cp.list_sessions()) == 1 and await jobs_in_store(gl_api) == 1
    # Without the key, the same start is refused (the name is taken): the key is what makes a
    # retry safe.
    assert (await post(gl_api, "/sessions", None, spec)).status_code == 409

    # Not up yet: the cell is refused, and the refusal replayed (a 4xx is an answer too).
    cell = {"code": "1 + 1", "client": "kernel-a"}
    one = await post(gl_api, "/sessions/s1/cells", "k-8", cell, params={"wait": "0"})
    assert one.status_code == 409 and one.json()["code"] == "session_not_ready"
    two = await post(gl_api, "/sessions/s1/cells", "k-8", cell, params={"wait": "0"})
    assert two.headers["Idempotency-Replayed"] == "true"
    assert (two.status_code, two.json()) == (one.status_code, one.json())


async def test_a_cell_is_run_once_and_a_retry_follows_it(
    gl_api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "")  # IPython only: the zygote starts fast
    agent = WorkerAgent(
        InProcessTransport(gl_api.cp),
        WorkerRegistration(name="w1"),
        ExecutorConfig(work_root=tmp_path / "work"),
        heartbeat_interval=0.5,
    )
    await agent.start()
    try:
        assert (
            await post(gl_api, "/sessions", "k-11", {"name": "s3", "holder": HOLDER})
        ).is_success
        await up(gl_api.cp, "s3")
        cell = {"code": "import os; os.getpid()", "client": "kernel-a"}
        one = await post(gl_api, "/sessions/s3/cells", "k-12", cell, params={"wait": "20"})
        two = await post(gl_api, "/sessions/s3/cells", "k-12", cell, params={"wait": "20"})
        assert one.status_code == two.status_code == 200, one.text
        assert two.headers["Idempotency-Replayed"] == "true" and two.json() == one.json()
        number = one.json()["cell"]["number"]
        assert [c.number for c in await gl_api.cp.session_cells("s3")] == [number]
        # What a kill -9 between the cell's commit and its answer leaves: the record noting the
        # cell, with no answer. The retry follows that cell; nothing runs twice.
        rec = await gl_api.store.get_idempotency("admin", "k-12")
        assert rec is not None and rec.jobs == (
            f"cell:{one.json()['cell']['session_id']}:{number}",
        )
        await gl_api.store.save_idempotency(dataclasses.replace(rec, status=None, answer=None))
        three = await post(gl_api, "/sessions/s3/cells", "k-12", cell, params={"wait": "20"})
        assert three.status_code == 200 and three.json()["cell"] == one.json()["cell"]
        # A record cut off before its cell was stored notes nothing: the retry runs it anew.
        fp = fingerprint("POST", "/api/v1/sessions/s3/cells", json.dumps(cell).encode())
        now = gl_api.cp.clock.now()
        await gl_api.store.save_idempotency(IdempotencyRecord("admin", "k-13", fp, now))
        four = await post(gl_api, "/sessions/s3/cells", "k-13", cell, params={"wait": "20"})
        assert four.status_code == 200 and four.json()["cell"]["number"] == number + 1
        assert len(await gl_api.cp.session_cells("s3")) == 2
    finally:
        await agent.stop()


async def test_a_request_cut_off_by_a_restart_resolves_to_the_job_it_made(gl_api: Api) -> None:
    # What a kill -9 between the job's commit and its answer leaves: the job, and the key's
    # record noting it with no answer (both written in one commit).
    job = await gl_api.cp.submit(JobSpec.model_validate(SPEC))
    path = "/api/v1/jobs"
    fp = fingerprint("POST", path, json.dumps(SPEC).encode())
    await gl_api.store.save_idempotency(
        IdempotencyRecord("admin", "k-9", fp, gl_api.cp.clock.now(), jobs=(job.id,))
    )
    r = await post(gl_api, "/jobs", "k-9", SPEC)
    assert r.status_code == 201 and r.json()["id"] == job.id
    assert r.headers["Idempotency-Replayed"] == "true"
    assert await jobs_in_store(gl_api) == 1
    rec = await gl_api.store.get_idempotency("admin", "k-9")
    assert rec is not None and rec.status == 201  # answered now: replayed as is from here on


async def test_openapi_documents_the_header_on_every_keyed_route(gl_api: Api) -> None:
    doc = (await gl_api.call("GET", "/openapi.json")).json()
    keyed = {
        (path, method)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in op["parameters"])
    }
    assert keyed == {
        ("/jobs", "post"),
        ("/jobs/run", "post"),
        ("/jobs/batch", "post"),
        ("/jobs/{job_id}/cancel", "post"),
        ("/sessions", "post"),
        ("/sessions/{session}/cells", "post"),
    }
