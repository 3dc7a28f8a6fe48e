"""Who may enrol as which worker (issue 12, items 6 and 8), over a real server in this loop.

A join token is shared by every machine an operator enrols, so it never names an existing worker:
it always gets a new id. Only the worker's own session token (or an instance token issued for
that worker id) comes back as that worker. A single-use instance token is spent only when the
join succeeds: a refused body leaves it usable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.contracts.workers import MAX_DEVICE_INDEX
from gpulayer_kernel.testing import until

from ..api.conftest import Api, running_api


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path, heartbeat_timeout=600) as a:
        yield a


def device(index: int) -> dict[str, Any]:
    return {"index": index, "vendor": "sim", "name": "sim", "kind": "sim"}


def registration(name: str, *indices: int) -> dict[str, Any]:
    return {"name": name, "capabilities": {"devices": [device(i) for i in indices]}}


async def test_a_join_token_cannot_take_over_a_worker(api: Api) -> None:
    victim, session = await api.join("gpu-box")
    job = await api.cp.submit(
        JobSpec(workload=CommandWorkload(argv=["true"]), resources=Resources(worker="gpu-box"))
    )

    async def placed() -> bool:
        # Handed out, not only placed: the job's state changes when its placement is staged,
        # the worker's record once the placement is written and given to it (a full run read
        # the record between the two, and the victim's "changed" under the impostor's join).
        held = [w.running for w in await api.cp.workers() if w.id == victim]
        return (await api.cp.get(job.id)).state == JobState.PLACED and held == [[job.id]]

    await until(placed, what="the job to be placed on the victim and handed to it")
    before = next(w for w in await api.cp.workers() if w.id == victim)
    # The join token, asking for the victim's id under the victim's own name: a new worker.
    r = await api.call(
        "POST", "/workers/join", "join", json={"name": "gpu-box"}, params={"worker_id": victim}
    )
    assert r.status_code == 200, r.text
    impostor = r.json()["worker"]["id"]
    stolen = r.json()["session_token"]
    assert impostor != victim
    # The victim is untouched: its record, its session, its job.
    after = next(w for w in await api.cp.workers() if w.id == victim)
    # Its own heartbeat may land in between: everything else is as it was.
    assert after.model_copy(update={"last_heartbeat": 0.0}) == before.model_copy(
        update={"last_heartbeat": 0.0}
    )
    assert (await api.call("POST", "/worker/heartbeat", session)).status_code == 200
    r = await api.call("POST", f"/worker/jobs/{job.id}/started", stolen)
    assert r.status_code == 403 and r.json()["code"] == "not_your_job"
    r = await api.call("GET", "/worker/work", stolen, params={"wait": "0"})
    assert r.status_code == 200 and r.json()["assignments"] == []
    # A join token bound to a worker id (the store allows it) is still just a join token.
    bound = await api.new_token("join", worker_id=victim)
    r = await api.call("POST", "/workers/join", bound, json={"name": "gpu-box"})
    assert r.status_code == 200 and r.json()["worker"]["id"] not in (victim, impostor)
    # The victim's own session re-joins as itself, whatever id it asks for.
    r = await api.call(
        "POST", "/workers/join", session, json={"name": "gpu-box"}, params={"worker_id": impostor}
    )
    assert r.status_code == 200 and r.json()["worker"]["id"] == victim
    assert (await api.call("POST", "/worker/heartbeat", session)).status_code == 401  # rotated


async def test_an_instance_token_issued_for_a_worker_enrols_as_it(api: Api) -> None:
    victim, _ = await api.join("box")
    token = await api.new_token("instance", worker_id=victim)
    r = await api.call("POST", "/workers/join", token, json={"name": "box"})
    assert r.status_code == 200 and r.json()["worker"]["id"] == victim
    # An instance token for no worker in particular enrols a new one.
    plain = await api.new_token("instance")
    r = await api.call("POST", "/workers/join", plain, json={"name": "box"})
    assert r.status_code == 200 and r.json()["worker"]["id"] != victim


@pytest.mark.parametrize(
    ("case", "body"),
    [
        ("device index past the bound", registration("w", 0, MAX_DEVICE_INDEX + 1)),
        ("device index of 10**12", registration("w", 10**12)),
        ("an unknown field", {"name": "w", "gpus": 4}),
        ("no name", {}),
    ],
)
async def test_a_refused_join_does_not_spend_an_instance_token(
    api: Api, case: str, body: dict[str, Any]
) -> None:
    token = await api.new_token("instance")
    r = await api.call("POST", "/workers/join", token, json=body)
    assert r.status_code == 422, (case, r.text)
    assert r.json()["code"] == "validation_failed"
    r = await api.call("POST", "/workers/join", token, content=b'{"name": "w"')  # not JSON
    assert r.status_code == 422
    (rec,) = [t for t in api.tokens.list() if t.kind == "instance"]
    assert not rec.used
    assert (await api.store.list_tokens()) and not next(
        t for t in await api.store.list_tokens() if t.id == rec.id
    ).used
    # The good join with the same token works, once.
    r = await api.call("POST", "/workers/join", token, json=registration("w", 0, MAX_DEVICE_INDEX))
    assert r.status_code == 200, r.text
    r = await api.call("POST", "/workers/join", token, json=registration("w2"))
    assert r.status_code == 401 and r.json()["code"] == "token_replayed"


async def test_an_enrolment_that_fails_gives_the_instance_token_back(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = await api.new_token("instance")
    real = api.cp.register

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the store is full")

    monkeypatch.setattr(api.cp, "register", broken)
    r = await api.call("POST", "/workers/join", token, json={"name": "w"})
    assert r.status_code == 500
    monkeypatch.setattr(api.cp, "register", real)
    r = await api.call("POST", "/workers/join", token, json={"name": "w"})
    assert r.status_code == 200


async def test_two_joins_racing_with_one_instance_token_enrol_one_worker(api: Api) -> None:
    token = await api.new_token("instance")
    answers = await asyncio.gather(
        *(api.call("POST", "/workers/join", token, json={"name": f"w{i}"}) for i in range(4))
    )
    assert sorted(r.status_code for r in answers) == [200, 401, 401, 401]
    assert len(await api.cp.workers()) == 1


async def test_a_worker_whose_join_answer_was_lost_joins_again_as_itself(api: Api) -> None:
    """Its instance token was spent, its answer never came (the control plane killed, a
    failover): the worker sends its join again, with the same enrolment nonce, and is the worker
    that join made. Another worker with the token, or a join without the nonce, is refused."""
    from gpulayer_kernel.contracts import WorkerRegistration
    from gpulayer_kernel.errors import Unauthorized
    from gpulayer_kernel.worker.http import HttpTransport

    token = await api.new_token("instance")
    reg = WorkerRegistration.model_validate(registration("box", 0))
    worker, thief = HttpTransport(api.url, token), HttpTransport(api.url, token)
    try:
        first = await worker.register(reg)
        worker.session_token = worker.worker_id = None  # the answer that never arrived
        again = await worker.register(reg)
        assert again.id == first.id and [w.id for w in api.cp.registry.all()] == [first.id]
        await worker.heartbeat()  # with the session the second answer brought
        with pytest.raises(Unauthorized) as replay:
            await thief.register(reg)  # another nonce
        assert replay.value.code == "token_replayed"
        r = await api.call("POST", "/workers/join", token, json=registration("box", 0))
        assert r.status_code == 401 and r.json()["code"] == "token_replayed"  # no nonce
        # Removed by an admin, it cannot come back under its id, not even by that retry.
        r = await api.call("DELETE", f"/workers/{first.id}", params={"force": "1"})
        assert r.status_code == 200, r.text
        worker.session_token = worker.worker_id = None
        with pytest.raises(Unauthorized) as revoked:
            await worker.register(reg)
        assert revoked.value.code == "token_revoked"
    finally:
        await worker.close()
        await thief.close()
