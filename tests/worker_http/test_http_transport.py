"""The same WorkerAgent and JobExecutor over HttpTransport, against a real server in this loop:
each test over plain HTTP and again with the worker tunnel (``wire/tunnel.py``) carrying the
worker routes' small requests."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.api import ApiServer
from gpulayer_kernel.api.tunnel import WorkerTunnel
from gpulayer_kernel.client.clients import AsyncClient
from gpulayer_kernel.contracts import (
    CommandWorkload,
    FinishReport,
    JobSpec,
    JobState,
    PythonWorkload,
    WorkerRegistration,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import Conflict, Forbidden, NotFound, Unauthorized, Unavailable
from gpulayer_kernel.security import TokenService
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.executor import ExecutorConfig
from gpulayer_kernel.worker.http import HttpTransport

from ..api.conftest import Api, start_api, stop_api

PY = sys.executable
AgentFactory = Callable[..., Awaitable[WorkerAgent]]


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


@pytest.fixture(params=[False, True], ids=["http", "tunnel"])
def tunnel(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
async def agent(api: Api, tmp_path: Path, tunnel: bool) -> AsyncIterator[AgentFactory]:
    agents: list[WorkerAgent] = []

    async def start(name: str = "w1", url: str | None = None) -> WorkerAgent:
        t = HttpTransport(url or api.url, api.join_token, retry_for=20, tunnel=tunnel)
        a = WorkerAgent(
            t,
            WorkerRegistration(name=name),
            ExecutorConfig(work_root=tmp_path / f"work-{name}", kill_grace=1.0),
            heartbeat_interval=0.5,
            poll_wait=5,
        )
        await a.start()
        agents.append(a)
        return a

    yield start
    for a in agents:
        await a.stop()


async def test_a_job_with_logs_artifacts_and_result(
    api: Api, agent: AgentFactory, tunnel: bool
) -> None:
    w = await agent()
    assert w.info is not None and w.info.transport == "http"
    script = (
        "import os, json, pathlib\n"
        "print('line one'); print('line two', flush=True)\n"
        "out = pathlib.Path(os.environ['GPULAYER_OUTPUT'])\n"
        "(out / 'sub').mkdir()\n"
        "(out / 'sub' / 'metrics.json').write_text(json.dumps({'acc': 0.9}))\n"
        "pathlib.Path(os.environ['GPULAYER_RESULT']).write_text(json.dumps({'ok': True}))\n"
    )
    async with AsyncClient(api.url, api.client_token) as c:
        job = await c.submit(cmd(PY, "-c", script))
        done = await c.wait(job.id, timeout=30)
        assert done.state == JobState.SUCCEEDED, done.reason
        assert done.result == {"ok": True}
        page = await c.logs(job.id, limit=100)
        texts = [r.text for r in page.records if r.stream == "stdout"]
        assert texts == ["line one", "line two"]
        assert [a.name for a in done.artifacts] == ["sub/metrics.json"]
        assert json.loads(await c.artifact(job.id, "sub/metrics.json")) == {"acc": 0.9}
    opened = [s for s in api.server.context.streams if isinstance(s, WorkerTunnel)]
    if tunnel:  # the long-poll that brought the job and the reports went on it
        assert len(opened) == 1 and opened[0].answered >= 2
    else:
        assert not opened


async def test_a_bundle_is_fetched_by_digest(api: Api, agent: AgentFactory) -> None:
    await agent()
    digest, data = bundles.build({"mod.py": b"def f(x):\n    return {'twice': 2 * x}\n"})
    async with AsyncClient(api.url, api.client_token) as c:
        await c.put_bundle(data)
        job = await c.submit(
            JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="mod:f", args={"x": 21}))
        )
        done = await c.wait(job.id, timeout=30)
        assert done.state == JobState.SUCCEEDED, done.reason
        assert done.result == {"twice": 42}


async def test_secrets_are_redacted_even_when_written_in_pieces(
    api: Api, agent: AgentFactory
) -> None:
    secret = "hf_Sup3rS3cretValue"
    await agent()
    script = (
        "import os, sys\n"
        "s = os.environ['HF_TOKEN']\n"
        "print('whole:', s)\n"
        "print(s[:3], end='', flush=True); print(s[3:])\n"
        "print('stderr', s, file=sys.stderr)\n"
    )
    async with AsyncClient(api.url, api.client_token) as c:
        await c.set_secret("HF_TOKEN", secret)
        job = await c.submit(cmd(PY, "-c", script, secrets=["HF_TOKEN"]))
        done = await c.wait(job.id, timeout=30)
        assert done.state == JobState.SUCCEEDED, done.reason
        page = await c.logs(job.id, limit=100)
        texts = [r.text for r in page.records]
        assert "whole: ***" in texts and "***" in texts and "stderr ***" in texts
        answers = [
            (await api.call("GET", path)).text
            for path in (
                "/jobs",
                f"/jobs/{job.id}",
                f"/jobs/{job.id}/logs",
                "/events",
                "/workers",
                "/secrets",
                "/status",
                "/tokens?all=1",
                f"/jobs/{job.id}/explain",
            )
        ]
        assert all(secret not in a for a in answers)
        assert "HF_TOKEN" in answers[5]


async def test_cancel_reaches_the_worker(api: Api, agent: AgentFactory) -> None:
    await agent()
    async with AsyncClient(api.url, api.client_token) as c:
        job = await c.submit(cmd(PY, "-c", "import time; print('up', flush=True); time.sleep(60)"))
        page = await c.logs(job.id, wait=20)
        while not any(r.text == "up" for r in page.records):
            page = await c.logs(job.id, since=page.next_since, wait=20)
        await c.cancel(job.id)
        done = await c.wait(job.id, timeout=20)
        assert done.state == JobState.CANCELLED


async def test_transport_errors_map_onto_the_agent_s_types(api: Api, tunnel: bool) -> None:
    t = HttpTransport(api.url, api.join_token, retry_for=0.5, tunnel=tunnel)
    try:
        info = await t.register(WorkerRegistration(name="wx"))
        assert t.worker_id == info.id and t.max_wait == api.server.context.limits.max_wait
        assert t.heartbeat_interval is not None and t.heartbeat_interval < 5.0
        queued = await api.cp.submit(cmd("true", resources={"worker": "nobody"}))
        with pytest.raises(Forbidden):
            await t.report_finished(queued.id, FinishReport(state="succeeded"))
        with pytest.raises(NotFound):
            await t.report_started("0123456789ab")
        with pytest.raises(Forbidden):
            await t.fetch_blob("0" * 64)
        job = await api.cp.submit(cmd("true", resources={"worker": "wx"}))
        work = await t.next_work(5)
        assert [a.job.id for a in work.assignments] == [job.id]
        with pytest.raises(Conflict) as pending:
            await t.get_rendezvous(job.id, wait=0)
        assert pending.value.code == "rendezvous_pending"
        session = t.session_token
        t.session_token = "glt_w_0123456789ab_" + "x" * 43
        with pytest.raises(Unauthorized):
            await t.heartbeat()
        t.session_token = session
        await t.heartbeat()
    finally:
        await t.close()
    dead = HttpTransport("http://127.0.0.1:9", api.join_token, retry_for=0.3, tunnel=tunnel)
    try:
        with pytest.raises(Unavailable) as down:
            await dead.register(WorkerRegistration(name="wy"))
        assert down.value.code == "server_unreachable" and down.value.status == 503
        dead.worker_id = "x"
        with pytest.raises(Unavailable):
            await dead.report_started("0123456789ab")  # retried for retry_for, then raised
    finally:
        await dead.close()


async def test_a_lost_worker_rejoins_with_its_id(tmp_path: Path, tunnel: bool) -> None:
    api = await start_api(tmp_path, heartbeat_timeout=0.3)
    t = HttpTransport(api.url, api.join_token, tunnel=tunnel)
    try:
        first = await t.register(WorkerRegistration(name="wz"))
        old_session = t.session_token

        async def lost() -> bool:
            return any(w.state == "lost" for w in await api.cp.workers())

        await until(lost, 5, what="the worker to be marked lost")
        with pytest.raises(NotFound):
            await t.heartbeat()
        again = await t.register(WorkerRegistration(name="wz"))  # what the agent does
        assert again.id == first.id and t.session_token != old_session
        # Its session was revoked (say, by an operator): the join token, shared by every
        # machine, cannot speak for that id (issue 12, item 8), so it comes back as a new worker.
        await api.tokens.revoke_where(lambda r: r.worker_id == first.id)
        third = await t.register(WorkerRegistration(name="wz"))
        assert third.id != first.id and t.worker_id == third.id
    finally:
        await t.close()
        await stop_api(api)


async def test_a_server_restart_mid_job_records_the_result_once(
    tmp_path: Path, tunnel: bool
) -> None:
    """Stop the server (and its ControlPlane) while a job runs; start a new one on the same port
    and database: the worker reconnects and the job's result is recorded exactly once."""
    api = await start_api(tmp_path, heartbeat_timeout=10.0)
    port = api.server.port
    t = HttpTransport(api.url, api.join_token, retry_for=60, tunnel=tunnel)
    w = WorkerAgent(
        t,
        WorkerRegistration(name="wr"),
        ExecutorConfig(work_root=tmp_path / "work"),
        heartbeat_interval=0.5,
        poll_wait=2,
    )
    await w.start()
    marker = tmp_path / "go"
    script = (
        "import os, time, pathlib, json\n"
        "print('started', flush=True)\n"
        f"while not pathlib.Path({str(marker)!r}).exists(): time.sleep(0.02)\n"
        "print('finishing', flush=True)\n"
        "pathlib.Path(os.environ['GPULAYER_RESULT']).write_text(json.dumps(42))\n"
    )
    job = await api.cp.submit(cmd(PY, "-c", script))
    page = await api.cp.logs(job.id, wait=20)
    while not any(r.text == "started" for r in page.records):
        page = await api.cp.logs(job.id, since=page.next_since, wait=20)
    await api.http.aclose()
    await api.server.stop()
    await api.cp.close()
    await api.store.close()
    marker.write_text("go")  # the job finishes while the control plane is down

    def job_exited() -> bool:
        script = str(marker)
        alive = (p.info["cmdline"] or [] for p in psutil.process_iter(["cmdline"]))
        return not any(script in " ".join(argv) for argv in alive)

    await until(job_exited, what="the job's process to exit")
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"), heartbeat_timeout=10.0)
    await cp.start()
    tokens = await TokenService(store).load()
    server = ApiServer(cp, tokens)
    await server.start("127.0.0.1", port)
    try:
        done = await cp.wait(job.id, timeout=30)
        assert done.state == JobState.SUCCEEDED and done.result == 42
        finished_events = [
            e
            for e in (await cp.events(0)).events
            if e.job is not None and e.job.id == job.id and e.job.state == JobState.SUCCEEDED
        ]
        assert len(finished_events) == 1
        texts = [r.text for r in (await cp.logs(job.id, limit=100)).records]
        assert texts.count("finishing") == 1 and texts.count("started") == 1
        # The worker is still the same one and still takes work.
        workers = await cp.workers()
        assert [x.name for x in workers] == ["wr"] and workers[0].state != "lost"
        second = await cp.submit(cmd("true"))
        assert (await cp.wait(second.id, timeout=30)).state == JobState.SUCCEEDED
    finally:
        await w.stop()
        await server.stop()
        await cp.close()
        await store.close()
