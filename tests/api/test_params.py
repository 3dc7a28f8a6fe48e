"""Every numeric query parameter of every route, out of bounds: 400 naming it, never a 5xx
(issue 12, item 8: ``logs?since=2**63`` was a 500). The routes come from the route table, so a
new parameter is covered here without anyone adding it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gpulayer_kernel.api import Param, operations
from gpulayer_kernel.api.params import INT64_MAX
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState, Resources
from gpulayer_kernel.testing import until

from .conftest import Api, start_api, stop_api

NUMERIC = [
    (template, method, p)
    for template, method, _, spec in operations()
    for p in spec.query
    if p.kind in ("integer", "number")
]


def bad_values(p: Param) -> list[str]:
    """Values no numeric parameter accepts, and the ones below or above its own bounds."""
    values = [
        str(2**63),
        str(2**64),
        str(10**40),
        "-" + str(2**63 + 1),
        "1_0",  # int() and float() take these; a query parameter does not
        "\u0663",  # ARABIC-INDIC DIGIT THREE
        "0x10",
        "nan",
        "inf",
        "1e400",
        "",
        "seven",
    ]
    if p.kind == "integer":
        values.append("1.5")
    if p.minimum is not None:
        values.append(str(int(p.minimum) - 1))
    if isinstance(p.maximum, int | float):
        values.append(str(int(p.maximum) + 1))
    return values


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("params")
    api = await start_api(home, heartbeat_timeout=600)
    try:
        worker_id, session = await api.join("w1")
        job = await api.cp.submit(
            JobSpec(workload=CommandWorkload(argv=["true"]), resources=Resources(worker="w1"))
        )

        async def placed() -> bool:
            return (await api.cp.get(job.id)).state == JobState.PLACED

        await until(placed, what="the job to be placed on w1")
    finally:
        await stop_api(api)
    # Restarted: the job's logs now come from the store, where a sequence number past 2**63 - 1
    # once failed as a 500 (the server that took the job answers from memory).
    api = await start_api(home, heartbeat_timeout=600)
    try:
        yield {"api": api, "job_id": job.id, "worker_id": worker_id, "session": session}
    finally:
        await stop_api(api)


def fill(template: str, world: dict[str, Any]) -> str:
    values = {"job_id": world["job_id"], "worker_id": world["worker_id"], "digest": "0" * 64}
    values |= {"name": "x", "token_id": "0" * 12}
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", value).replace("{" + key + ":path}", value)
    return out


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("template", "method", "param"),
    NUMERIC,
    ids=[f"{m.upper()} {t} ?{p.name}" for t, m, p in NUMERIC],
)
async def test_out_of_bounds_numbers_are_400_naming_the_parameter(
    world: dict[str, Any], template: str, method: str, param: Param
) -> None:
    api: Api = world["api"]
    token = world["session"] if template.startswith("/worker/") else "client"
    for value in bad_values(param):
        r = await api.call(method.upper(), fill(template, world), token, params={param.name: value})
        assert r.status_code == 400, f"?{param.name}={value!r}: {r.status_code} {r.text}"
        body = r.json()
        assert body["code"] == "bad_parameter", value
        assert body["details"] == {"parameter": param.name}, value
        assert f"query parameter {param.name}=" in body["message"], value


@pytest.mark.asyncio(loop_scope="module")
async def test_the_largest_sequence_number_is_an_empty_page(world: dict[str, Any]) -> None:
    api: Api = world["api"]
    job_id = world["job_id"]
    r = await api.call("GET", f"/jobs/{job_id}/logs", params={"since": str(2**63)})
    assert r.status_code == 400 and r.json()["details"] == {"parameter": "since"}
    r = await api.call("GET", f"/jobs/{job_id}/logs", params={"since": str(INT64_MAX)})
    assert r.status_code == 200 and r.json()["records"] == []
    r = await api.call("GET", "/events", params={"since": str(INT64_MAX)})
    assert r.status_code == 200
    # Signs and exponents that are numbers still are.
    r = await api.call("GET", "/jobs", params={"limit": "+5"})
    assert r.status_code == 200
    r = await api.call("GET", "/events", params={"wait": "1e-3"})
    assert r.status_code == 200


def test_openapi_states_every_integer_bound() -> None:
    from gpulayer_kernel.api import build_openapi

    doc = build_openapi(operations())
    for path in doc["paths"].values():
        for operation in path.values():
            for p in operation["parameters"]:
                if p["schema"].get("type") == "integer":
                    assert p["schema"]["maximum"] <= INT64_MAX, p
                    assert "minimum" in p["schema"], p
