"""Users over HTTP, as found from outside (issue 23, item 6): other users' job ids stay out of
``GET /workers`` and ``GET /events``; a quota for a user who does not exist is refused; and
disabling a user stops their sessions and cancels their queued jobs, while running ones finish."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from gpulayer_kernel.contracts import JobState, WorkerRegistration
from gpulayer_kernel.contracts.workers import HIDDEN_JOB
from gpulayer_kernel.security import Role, TokenKind
from gpulayer_kernel.testing import until

from ..api.conftest import Api, start_api, stop_api
from ..conftest import sim_caps

pytestmark = pytest.mark.asyncio(loop_scope="module")

ONE_GPU = {"workload": {"kind": "command", "argv": ["true"]}, "resources": {"gpus": 1}}


@dataclass
class Team:
    api: Api
    tokens: dict[str, str]  # admin, alice, bob (users), vera (viewer)
    alice_job: str
    bob_job: str


async def placed(api: Api, job_id: str) -> None:
    async def is_placed() -> bool:
        return (await api.cp.get(job_id)).state == JobState.PLACED

    await until(is_placed, 10, what=f"job {job_id} to be placed")


async def submit(api: Api, token: str, body: dict[str, Any] = ONE_GPU) -> str:
    r = await api.call("POST", "/jobs", token, json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def team(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Team]:
    api = await start_api(tmp_path_factory.mktemp("people"), heartbeat_timeout=600)
    try:
        tokens = {"admin": api.client_token}
        for name, role in (("alice", Role.USER), ("bob", Role.USER), ("vera", Role.VIEWER)):
            await api.cp.users.add(name, role)
            _, tokens[name] = await api.tokens.create(TokenKind.CLIENT, owner=name)
        # No agent behind it: what is placed there stays placed, and the test reads it.
        await api.cp.register(WorkerRegistration(name="w", capabilities=sim_caps(4)))
        alice_job = await submit(api, tokens["alice"])
        bob_job = await submit(api, tokens["bob"])
        for job_id in (alice_job, bob_job):
            await placed(api, job_id)

        async def both_running() -> bool:  # the worker's record follows its jobs' placements
            [w] = await api.cp.workers()
            return len(w.running) == 2

        await until(both_running, 10, what="the worker's record to hold both jobs")
        yield Team(api, tokens, alice_job, bob_job)
    finally:
        await stop_api(api)


async def test_a_user_reads_workers_without_other_users_job_ids(team: Team) -> None:
    api = team.api
    r = await api.call("GET", "/workers", team.tokens["alice"])
    assert r.status_code == 200, r.text
    [w] = r.json()["workers"]
    assert w["running"] == [team.alice_job]
    assert sorted(w["device_jobs"].values()) == sorted([team.alice_job, HIDDEN_JOB])
    assert team.bob_job not in r.text
    # Admins and viewers read everyone's work (as they read every job).
    for reader in ("admin", "vera"):
        r = await api.call("GET", "/workers", team.tokens[reader])
        [w] = r.json()["workers"]
        assert w["running"] == sorted([team.alice_job, team.bob_job]), reader


async def test_a_user_reads_worker_events_without_other_users_job_ids(team: Team) -> None:
    api = team.api
    r = await api.call("GET", "/events", team.tokens["alice"], params={"since": 0, "wait": 0})
    assert r.status_code == 200, r.text
    workers = [e["worker"] for e in r.json()["events"] if e["kind"] == "worker"]
    assert workers and any(team.alice_job in w["running"] for w in workers)
    assert team.bob_job not in r.text
    r = await api.call("GET", "/events", team.tokens["admin"], params={"since": 0, "wait": 0})
    assert team.bob_job in r.text  # it is there to hide


async def test_a_quota_for_a_user_who_does_not_exist_is_refused(team: Team) -> None:
    api = team.api
    body = {"max_gpus": 2, "max_queued": None}
    r = await api.call("PUT", "/quotas/user/nobody", json=body)
    assert r.status_code == 404, r.text
    assert r.json()["code"] == "user_not_found" and "nobody" in r.json()["message"]
    assert "gpulayer user add nobody" in r.json()["hint"]
    assert (await api.call("GET", "/quotas")).json()["quotas"] == []
    # A user who exists, and a group (which needs no members yet), are fine.
    assert (await api.call("PUT", "/quotas/user/alice", json=body)).status_code == 200
    assert (await api.call("PUT", "/quotas/group/vision", json=body)).status_code == 200
    for who in ("user/alice", "group/vision"):
        off = {"max_gpus": None, "max_queued": None}
        assert (await api.call("PUT", f"/quotas/{who}", json=off)).status_code == 200


async def test_disabling_a_user_stops_their_sessions_and_queued_jobs_not_running_ones(
    team: Team,
) -> None:
    api = team.api
    bob = team.tokens["bob"]
    session = {"name": "bobs", "holder": {"client": "bob-kernel"}, "resources": {"gpus": 1}}
    r = await api.call("POST", "/sessions", bob, json=session)
    assert r.status_code == 201, r.text
    session_job = r.json()["id"]
    await placed(api, session_job)
    waiting = await submit(
        api, bob, {**ONE_GPU, "resources": {"gpus": 4}, "wait_for_capacity": True}
    )
    alices = await submit(api, team.tokens["alice"], {**ONE_GPU, "wait_for_capacity": True})
    r = await api.call("POST", "/users/bob", json={"disabled": True})
    assert r.status_code == 200 and r.json()["disabled"] is True, r.text
    why = "user bob was disabled by admin"
    job = await api.cp.get(waiting)
    assert job.state == JobState.CANCELLED and job.reason == f"cancelled: {why}"
    # The session's job is being stopped (its worker confirms); the session says why.
    job = await api.cp.get(session_job)
    assert job.cancel_requested and why in (job.reason or ""), job.reason
    [info] = [s for s in await api.cp.list_sessions(include_ended=True) if s.id == session_job]
    assert why in (info.reason or job.reason or "")
    # Running (here: placed) work finishes; other users' work is untouched.
    job = await api.cp.get(team.bob_job)
    assert job.state == JobState.PLACED and not job.cancel_requested
    assert (await api.cp.get(alices)).state in (JobState.QUEUED, JobState.PLACED)
    r = await api.call("GET", "/jobs", bob)
    assert r.status_code == 401 and r.json()["code"] == "user_disabled"
    # Enabling again brings nothing back, and disabling twice ends nothing more.
    assert (await api.call("POST", "/users/bob", json={"disabled": False})).status_code == 200
    assert (await api.cp.get(waiting)).state == JobState.CANCELLED
