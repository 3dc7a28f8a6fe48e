"""Protocol 1.1 (ADR 0003): fewer round trips, counted; older peers still served, both ways.

Requests are counted at the server (every answered request, by route) around one job: a served
Python job end to end costs at most 3 (the client's run, the worker's poll that took it, the
worker's one report), a notebook cell at most 4. Counts depend on "short": the job ends within
the worker's report linger and the run's linger (both 50 ms by default); these tests give both 2 s
so that a loaded machine cannot turn a 10 ms job into a long one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import queue
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel import bundles, versions
from gpulayer_kernel.api import ApiServer
from gpulayer_kernel.client.clients import AsyncClient
from gpulayer_kernel.contracts import (
    CommandWorkload,
    FinishReport,
    Job,
    JobSpec,
    JobState,
    PythonWorkload,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import ConfigInvalid, InvalidInput
from gpulayer_kernel.jupyter import bridge as bridge_mod
from gpulayer_kernel.security import TokenService
from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.http import HttpTransport

from .conftest import Api, start_api, stop_api

LINGER = 2.0


class Requests:
    """Every request the server answered, as (method, route tail, status)."""

    def __init__(self, api: Api) -> None:
        self.seen: list[tuple[str, str, int]] = []
        api.server.app.settings["log_function"] = self._log

    def _log(self, handler: Any) -> None:
        path = handler.request.path.removeprefix("/api/v1")
        self.seen.append((handler.request.method, path, handler.get_status()))

    def routes(self) -> Counter[str]:
        return Counter(f"{m} {_route(p)}" for m, p, _ in self.seen)


# The workers here beat once a minute (so the requests a test counts are its own), and a
# silence shorter than that must not read as a lost worker: a loaded machine's 1 s job once
# outlasted the default 5 s timeout and the worker was declared lost under it.
BEAT, SILENCE = 60.0, 180.0


def _route(path: str) -> str:
    parts = path.split("/")
    return "/".join("{id}" if len(p) in (12, 64) and p.isalnum() else p for p in parts)


async def _agent(api: Api, tmp: Path, name: str, **transport: Any) -> WorkerAgent:
    agent = WorkerAgent(
        HttpTransport(api.url, api.join_token, **transport),
        WorkerRegistration(name=name),
        ExecutorConfig(work_root=tmp / f"work-{name}", report_linger=LINGER),
        heartbeat_interval=BEAT,
        poll_wait=20,
    )
    await agent.start()
    return agent


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Api, WorkerAgent]]:
    api = await start_api(tmp_path, heartbeat_interval=BEAT, heartbeat_timeout=SILENCE)
    agent = await _agent(api, tmp_path, "w1")
    try:
        yield api, agent
    finally:
        await agent.stop()
        await stop_api(api)


def _cell(text: str) -> tuple[JobSpec, bytes]:
    digest, data = bundles.build({"cell.py": text.encode()})
    spec = JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py"))
    return spec, data


async def _settled(api: Api, agent: WorkerAgent) -> None:
    """The worker is idle again (its job's end reported: answered, so counted), its next poll
    parked (not an answered request)."""
    assert agent.info is not None
    wid = agent.info.id

    def idle_and_parked() -> bool:
        return not agent.running and api.cp.registry.polls(wid) >= 1

    await until(idle_and_parked, 10, what="the worker to finish its job and poll again")


async def test_a_served_python_job_costs_three_requests(
    served: tuple[Api, WorkerAgent],
) -> None:
    api, agent = served
    async with AsyncClient(api.url, api.client_token) as client:
        spec, data = _cell("print('hello')\n6 * 7\n")
        await client.put_bundle(data)  # uploaded once, as a script's bundle is
        warm, _ = _cell("None\n")  # the first job also starts the worker's zygote
        await client.run(warm, bundles.build({"cell.py": b"None\n"})[1], wait=20, linger=LINGER)
        await client.workers()  # its second request: the client's tunnel opens (once, not counted)
        [tunnel] = client.wire._tunnels.values()
        await until(lambda: tunnel._conn is not None, 10, what="the client's tunnel to open")
        await _settled(api, agent)
        counted = Requests(api)
        page = await client.run(spec, wait=20, linger=LINGER)
        await _settled(api, agent)
    assert page.job.state == JobState.SUCCEEDED and page.job.result == 42
    assert [r.text for r in page.records if r.stream == "stdout"] == ["hello"]
    routes = counted.routes()
    assert routes == Counter(
        {"POST /jobs/run": 1, "GET /worker/work": 1, "POST /worker/reports": 1}
    ), counted.seen
    assert sum(routes.values()) <= 3


async def test_a_notebook_cell_costs_at_most_four_requests(
    served: tuple[Api, WorkerAgent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The magic's path (``upload_bundle`` → ``submit`` → ``watch``), through a real bridge."""
    api, agent = served
    monkeypatch.setattr(bridge_mod, "LINGER", LINGER)
    bridge = bridge_mod.Bridge(bridge_mod.Target(url=api.url, token=api.client_token))
    try:

        def cell(text: str) -> tuple[Job, list[str]]:
            spec, data = _cell(text)
            bridge.upload_bundle(spec.workload.bundle, data)  # type: ignore[union-attr]
            job = bridge.submit(spec)
            updates: queue.Queue[bridge_mod.Update] = queue.Queue()
            bridge.watch(job.id, updates.put)
            seen: list[bridge_mod.Update] = []
            while not seen or seen[-1].kind not in ("done", "error"):
                seen.append(updates.get(timeout=30))
            done = seen[-1]
            assert done.kind == "done" and done.job is not None, done.error
            return done.job, [r.text for u in seen for r in u.records]

        await asyncio.to_thread(cell, "None\n")  # warm: the zygote starts
        await _settled(api, agent)
        counted = Requests(api)
        job, lines = await asyncio.to_thread(cell, "print('x =', 1 + 1)\n1 + 1\n")
        await _settled(api, agent)
    finally:
        await asyncio.to_thread(bridge.close)
    assert job.state == JobState.SUCCEEDED and job.result == 2 and "x = 2" in lines
    # A new cell: its bundle rides with its run, and comes to the worker with its work.
    assert sum(counted.routes().values()) <= 4, counted.seen
    assert counted.routes()["POST /jobs/run"] == 1 and "GET /bundles/{id}" not in counted.routes()


async def test_a_long_job_reports_its_start_on_its_own(
    served: tuple[Api, WorkerAgent], tmp_path: Path
) -> None:
    api, agent = served
    agent.reporter.linger = 0.05  # so that this job is long
    async with AsyncClient(api.url, api.client_token) as client:
        job = await client.submit(
            JobSpec(
                workload=CommandWorkload(argv=[sys.executable, "-c", "import time; time.sleep(1)"])
            )
        )
        await until(lambda: _state(api, job.id) == JobState.RUNNING, 10, what="it to run")
        done = await client.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED and done.started_at is not None


def _state(api: Api, job_id: str) -> JobState | None:
    job = api.cp.jobs.cached(job_id)
    return job.state if job is not None else None


# -- batches --------------------------------------------------------------------------------------


async def test_batched_reports_refuse_the_invalid_entry_only_and_say_which(
    served: tuple[Api, WorkerAgent],
) -> None:
    api, agent = served
    await agent.stop()  # this test speaks for the worker itself
    wid, token = await api.join("raw")
    a = await api.cp.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
    b = await api.cp.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
    await until(
        lambda: all(_state(api, j.id) == JobState.PLACED for j in (a, b)), 10, what="placed"
    )
    seen: set[str] = set()
    for _ in range(20):  # a loaded machine may hand them out over more than one poll
        work = await api.call("GET", "/worker/work", token, params={"wait": "1"})
        seen |= {x["job"]["id"] for x in work.json()["assignments"]}
        if seen >= {a.id, b.id}:
            break
    assert seen == {a.id, b.id}
    finished = {"state": "succeeded", "exit_code": 0}
    entries = [
        {"job_id": a.id, "attempt": 0, "started": True, "finished": finished},
        {"job_id": b.id, "attempt": 0, "finished": {"state": "done-ish"}},  # invalid
        {"job_id": b.id, "attempt": 7, "started": True},  # stale attempt
        "not an object",
        {"job_id": "f" * 12, "attempt": 0, "started": True},  # not this worker's
    ]
    r = await api.call("POST", "/worker/reports", token, json={"reports": entries})
    assert r.status_code == 200, r.text
    refused = {x["index"]: x for x in r.json()["refused"]}
    assert sorted(refused) == [1, 2, 3, 4]
    assert refused[1]["code"] == "validation_failed" and "reports[1]" in refused[1]["message"]
    assert "finished.state" in refused[1]["message"] and refused[1]["job_id"] == b.id
    assert refused[2]["code"] == "stale_attempt" and refused[2]["status"] == 409
    assert refused[3]["code"] == "validation_failed" and "not an object" in refused[3]["message"]
    assert refused[4]["code"] == "not_your_job"
    assert (await api.cp.get(a.id)).state == JobState.SUCCEEDED  # taken, start and end at once
    assert (await api.cp.get(b.id)).state == JobState.PLACED  # nothing changed
    ok = [{"job_id": b.id, "attempt": 0, "started": True, "finished": finished}]
    r = await api.call("POST", "/worker/reports", token, json={"reports": ok})
    assert r.status_code == 204 and r.content == b""
    assert (await api.cp.get(b.id)).state == JobState.SUCCEEDED


async def test_a_batched_submit_refuses_the_invalid_spec_only(
    served: tuple[Api, WorkerAgent],
) -> None:
    api, _ = served
    async with AsyncClient(api.url, api.client_token) as client:
        good = JobSpec(workload=CommandWorkload(argv=["true"]))
        r = await api.call(
            "POST",
            "/jobs/batch",
            json={"specs": [good.model_dump(mode="json"), {"workload": {"kind": "nope"}}, 3]},
        )
        assert r.status_code == 201, r.text
        answer = r.json()
        assert len(answer["jobs"]) == 1
        assert [x["index"] for x in answer["refused"]] == [1, 2]
        assert "specs[1]" in answer["refused"][0]["message"]
        out = await client.submit_many([good, good])
        assert all(not isinstance(o, Exception) for o in out)
        done = [await client.wait(o.id, timeout=30) for o in out]  # type: ignore[union-attr]
    assert {d.state for d in done} == {JobState.SUCCEEDED}


# -- bad input ------------------------------------------------------------------------------------


async def test_an_inline_bundle_must_be_the_one_its_spec_names(
    served: tuple[Api, WorkerAgent],
) -> None:
    api, _ = served
    spec, data = _cell("1\n")
    body = {"spec": spec.model_dump(mode="json"), "bundle": base64.b64encode(data + b"x").decode()}
    r = await api.call("POST", "/jobs/run", json=body)
    assert r.status_code == 422 and r.json()["code"] == "bundle_invalid", r.text
    assert spec.workload.bundle[:12] in r.json()["message"]  # type: ignore[union-attr]
    r = await api.call("POST", "/jobs/run", json={**body, "bundle": "***"})
    assert r.status_code == 400 and "base64" in r.json()["message"]
    cmd = JobSpec(workload=CommandWorkload(argv=["true"])).model_dump(mode="json")
    r = await api.call("POST", "/jobs/run", json={"spec": cmd, "bundle": body["bundle"]})
    assert r.status_code == 400 and r.json()["details"]["field"] == "bundle"
    r = await api.call("GET", "/jobs/abcdef123456/follow", params={"cursor": "nope"})
    assert r.status_code in (400, 404)
    job = await api.cp.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
    r = await api.call("GET", f"/jobs/{job.id}/follow", params={"cursor": "nope"})
    assert r.status_code == 400 and r.json()["code"] == "bad_parameter"


# -- versions, both ways --------------------------------------------------------------------------


async def test_a_client_of_another_major_version_is_refused_naming_both(
    served: tuple[Api, WorkerAgent],
) -> None:
    api, _ = served
    r = await api.http.get(
        api.base + "/status",
        headers={"Authorization": f"Bearer {api.client_token}", versions.HEADER: "2.0"},
    )
    assert r.status_code == 400 and r.json()["code"] == "protocol_unsupported"
    assert "2.0" in r.json()["message"] and "1.1" in r.json()["message"]
    assert r.headers[versions.HEADER] == "1.1"


async def test_a_server_of_another_major_version_is_refused_naming_both() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={}, headers={versions.HEADER: "2.3"})

    client = AsyncClient("http://127.0.0.1:9")
    client.wire._pools[client.wire.servers.url] = httpx.AsyncClient(  # a server from the future
        base_url="http://127.0.0.1:9/api/v1", transport=httpx.MockTransport(handler)
    )
    with pytest.raises(InvalidInput) as err:
        await client.status()
    assert err.value.code == "protocol_unsupported"
    assert "2.3" in err.value.message and "1.1" in err.value.message
    await client.aclose()


async def test_a_worker_and_a_client_of_1_1_speak_1_0_to_an_older_server(
    tmp_path: Path,
) -> None:
    api = await start_api(
        tmp_path, heartbeat_interval=BEAT, heartbeat_timeout=SILENCE, protocol="1.0"
    )
    agent = await _agent(api, tmp_path, "new")
    try:
        assert agent.transport.protocol == (1, 0)  # type: ignore[attr-defined]
        counted = Requests(api)
        async with AsyncClient(api.url, api.client_token) as client:
            spec, data = _cell("print('old')\n1\n")
            page = await client.run(spec, data, wait=20)
            while not page.job.state.terminal:
                page = await client.follow(page.job.id, page.next_since, page.cursor, wait=20)
            job = await client.wait(page.job.id, timeout=30)
            lines = [r.text for r in (await client.logs(job.id)).records]
            out = await client.submit_many([JobSpec(workload=CommandWorkload(argv=["true"]))])
        assert job.state == JobState.SUCCEEDED and job.result == 1 and "old" in lines
        assert not isinstance(out[0], Exception)
        routes = counted.routes()
        assert routes["POST /jobs/run"] == 1 and routes["PUT /bundles/{id}"] == 1  # then 1.0
        assert "POST /worker/reports" not in routes and routes["POST /worker/jobs/{id}/finished"]
        # Once told (the run's 405, with no protocol header), it asks no 1.1 route again.
        tried = [(m, p, s) for m, p, s in counted.seen if s in (404, 405) and m != "HEAD"]
        assert [(m, p) for m, p, _ in tried] == [("POST", "/jobs/run")], tried
    finally:
        await agent.stop()
        await stop_api(api)


async def test_a_worker_of_1_0_is_served_as_before(served: tuple[Api, WorkerAgent]) -> None:
    """Raw requests as a worker from before 1.1 sends them: no header, no batches."""
    api, agent = served
    await agent.stop()
    r = await api.call("POST", "/workers/join", "join", json={"name": "old", "transport": "http"})
    token = r.json()["session_token"]
    assert r.json()["protocol"] == "1.1"  # an extra key: an old worker reads what it knows
    spec, data = _cell("1\n")
    await api.cp.put_bundle(data)
    job = await api.cp.submit(spec)
    work = await api.call("GET", "/worker/work", token, params={"wait": "10"})
    assert work.status_code == 200 and "bundles" not in work.json()  # it would refuse the field
    for route, body in (("started", None), ("logs", {"lines": []})):
        r = await api.call("POST", f"/worker/jobs/{job.id}/{route}", token, json=body)
        assert r.status_code == 200 and r.content  # answers with bodies, as before
    report = FinishReport(state="succeeded", exit_code=0, result=1)
    r = await api.call(
        "POST", f"/worker/jobs/{job.id}/finished", token, json=json.loads(report.model_dump_json())
    )
    assert r.status_code == 200 and r.json()["state"] == "succeeded"
    r = await api.call("POST", "/worker/heartbeat", token)
    assert r.status_code == 200 and r.json()["name"] == "old"


async def test_a_1_1_worker_gets_small_bundles_with_its_work_and_204s(
    served: tuple[Api, WorkerAgent],
) -> None:
    api, agent = served
    await agent.stop()
    r = await api.call("POST", "/workers/join", "join", json={"name": "new", "transport": "http"})
    token = r.json()["session_token"]
    spec, data = _cell("2\n")
    await api.cp.put_bundle(data)
    await api.cp.submit(spec)
    work = await api.http.get(
        api.base + "/worker/work",
        params={"wait": "10"},
        headers={"Authorization": f"Bearer {token}", versions.HEADER: "1.1"},
    )
    digest = spec.workload.bundle  # type: ignore[union-attr]
    assert base64.b64decode(work.json()["bundles"][digest]) == data
    r = await api.http.post(
        api.base + "/worker/heartbeat",
        headers={"Authorization": f"Bearer {token}", "Prefer": "return=minimal"},
    )
    assert r.status_code == 204 and r.content == b""


async def test_a_worker_with_shared_folders_joins_a_server_from_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control plane from before workspaces (ADR 0022) forbids ``shares`` in a registration,
    as its contract forbade every unknown field: the worker joins it without them (its sessions
    there sync), instead of failing to join at all."""
    from pydantic import create_model

    from gpulayer_kernel.api import mixin
    from gpulayer_kernel.contracts import Contract, WorkerRegistration
    from gpulayer_kernel.contracts.workspace import WorkerShares

    fields = WorkerRegistration.model_fields
    older: Any = create_model(  # the registration as that server knew it
        "WorkerRegistration",
        __base__=Contract,
        **{n: (f.annotation, f) for n, f in fields.items() if n != "shares"},  # type: ignore[call-overload]
    )
    real = mixin.parse

    def parse_as_then(cls: Any, data: Any) -> Any:
        if cls is WorkerRegistration:
            return WorkerRegistration.model_validate(real(older, data).model_dump())
        return real(cls, data)

    monkeypatch.setattr(mixin, "parse", parse_as_then)
    api = await start_api(tmp_path, heartbeat_interval=BEAT, heartbeat_timeout=SILENCE)
    t = HttpTransport(api.url, api.join_token)
    try:
        shares = WorkerShares(host="laptop")
        info = await t.register(WorkerRegistration(name="new", shares=shares))
        assert info.name == "new" and info.shares is None
    finally:
        await t.close()
        await stop_api(api)


@pytest.mark.parametrize("times", [0.0, -0.5, 1.0, 1.5])
async def test_a_heartbeat_interval_not_below_the_timeout_is_refused(
    gl_cp: ControlPlane, times: float
) -> None:
    """Workers told to beat no more often than the plane's timeout would be declared lost
    between two beats (the flake that BEAT and SILENCE above fixed): refused, saying both."""
    cp = gl_cp
    tokens = await TokenService(cp.store).load()
    with pytest.raises(ConfigInvalid) as refused:
        ApiServer(cp, tokens, heartbeat_interval=times * cp.heartbeat_timeout)
    assert f"heartbeat timeout ({cp.heartbeat_timeout}s)" in refused.value.message
    assert refused.value.code == "config_invalid"
    ApiServer(cp, tokens, heartbeat_interval=cp.heartbeat_timeout / 3)  # below it: taken
