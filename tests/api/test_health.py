"""``GET /api/v1/health`` and ``/ready``: no token, the version and the role, 503 once the server
stops; in openapi.json as the only operations without security (the route-auth matrix declares
them public). A standby's answers: tests/store/test_standby_keys.py, on real PostgreSQL."""

from __future__ import annotations

from gpulayer_kernel import __version__
from gpulayer_kernel.api import build_openapi, operations

from .conftest import Api


async def test_health_answers_without_a_token(gl_api: Api) -> None:
    r = await gl_api.call("GET", "/health", None)
    assert r.status_code == 200
    assert r.json() == {
        "api_version": "gpulayer/v1",
        "status": "ok",
        "version": __version__,
        "role": "leader",
        "problem": None,
        "keys": gl_api.cp.secrets.held_key_ids(),  # ids of the keys it holds (issue 32)
    }
    assert len(r.json()["keys"]) == 1 and len(r.json()["keys"][0]) == 8
    assert r.headers["cache-control"] == "no-store"


async def test_ready_answers_the_leader_without_a_token(gl_api: Api) -> None:
    r = await gl_api.call("GET", "/ready", None)
    assert r.status_code == 200
    assert r.json() == {"api_version": "gpulayer/v1", "status": "ok", "role": "leader"}


async def test_health_is_503_once_the_server_is_stopping(gl_api: Api) -> None:
    gl_api.server.context.stopping.set()
    for route in ("/health", "/ready"):
        r = await gl_api.call("GET", route, None)
        assert r.status_code == 503
        assert r.json()["code"] == "shutting_down" and r.json()["hint"]


def test_openapi_marks_health_as_the_only_public_operation() -> None:
    paths = build_openapi(operations())["paths"]
    public = [
        (path, method)
        for path, ops in paths.items()
        for method, operation in ops.items()
        if operation["security"] == []
    ]
    assert sorted(public) == [("/health", "get"), ("/ready", "get")]
    health = paths["/health"]["get"]
    assert health["tags"] == ["public"]
    assert set(health["responses"]) == {"200", "503"}
