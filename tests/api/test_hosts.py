"""The API's two hosts and its clients: Jupyter's APIHandler composes with the mixins, the HTTP
client offers exactly the Connection calls, and an Embedded control plane can serve itself."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tornado.web

from gpulayer_kernel.api import USER_ROUTES, WORKER_ROUTES, GLMixin, user_handlers
from gpulayer_kernel.api.routes import compose
from gpulayer_kernel.client.clients import AsyncClient, Client
from gpulayer_kernel.client.connect import Connection
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.embedded import Embedded
from gpulayer_kernel.home import Layout, read_owner

GL = [sys.executable, "-m", "gpulayer_kernel.cli"]
AUTHENTICATED_CODE = tornado.web.authenticated(lambda self: None).__code__
# Keywords of one side only: in process the caller and a keyed request's claim (passed by the
# HTTP handler); over HTTP the request's own Idempotency-Key.
HTTP = ("who", "claim", "idempotency_key")


def test_user_mixins_compose_with_jupyter_s_api_handler() -> None:
    handlers = pytest.importorskip("jupyter_server.base.handlers")
    api_handler = handlers.APIHandler
    for mixin in USER_ROUTES:
        cls = compose(mixin, api_handler)
        mro = cls.__mro__
        assert mro.index(mixin) < mro.index(api_handler) < mro.index(handlers.JupyterHandler)
        # Jupyter keeps its own auth, XSRF and user; we bring errors and the body limit.
        for name in ("check_xsrf_cookie", "get_current_user", "get_login_url", "check_origin"):
            owner = next(k for k in mro if name in k.__dict__)
            assert owner.__module__.startswith(("jupyter_server", "tornado")), (mixin, name)
        assert next(k for k in mro if "write_error" in k.__dict__) is GLMixin
        assert next(k for k in mro if "prepare" in k.__dict__) is GLMixin  # and calls super()
        for method in ("get", "post", "put", "delete", "head"):
            fn = mixin.__dict__.get(method)
            if fn is not None:  # tornado.web.authenticated wraps every user operation
                assert fn.__code__ is AUTHENTICATED_CODE, (mixin, method)
    specs = user_handlers(api_handler, "/gpulayer/api/v1", None, None)  # type: ignore[arg-type]
    assert all(p.startswith("/gpulayer/api/v1/") for p, _, _ in specs)
    assert len(specs) == len(USER_ROUTES)
    # Worker routes never depend on the host's auth or cookies, and are never "authenticated".
    for h in WORKER_ROUTES:
        owner = next(k for k in h.__mro__ if "check_xsrf_cookie" in k.__dict__)
        assert owner.__module__ == "gpulayer_kernel.api.auth"
        assert all(
            getattr(h, m).__code__ is not AUTHENTICATED_CODE
            for m in ("get", "post", "put")
            if m in h.__dict__
        )


def test_the_client_offers_exactly_the_session_calls() -> None:
    session_calls = {
        name
        for name, _ in inspect.getmembers(Connection, inspect.isfunction)
        if not name.startswith("_")
    }
    assert session_calls
    for name in session_calls:
        want = inspect.signature(getattr(Connection, name))
        for cls in (AsyncClient, ControlPlane):
            got = getattr(cls, name)
            assert inspect.iscoroutinefunction(got), (cls, name)
            # In process the caller's identity is a keyword (None: the embedded admin); over
            # HTTP it is the token's. An HTTP write may also take its own Idempotency-Key.
            params = [p for p in inspect.signature(got).parameters.values() if p.name not in HTTP]
            expected = list(want.parameters.values())
            assert [(p.name, p.kind) for p in params] == [(p.name, p.kind) for p in expected], (
                cls,
                name,
            )
        sync = getattr(Client, name)
        assert not inspect.iscoroutinefunction(sync)
        assert [p for p in inspect.signature(sync).parameters if p not in HTTP] == list(
            want.parameters
        )
    for extra in ("set_secret", "secret_names", "delete_secret", "set_worker_state"):
        assert inspect.iscoroutinefunction(getattr(AsyncClient, extra))
        assert list(inspect.signature(getattr(AsyncClient, extra)).parameters) == [
            p for p in inspect.signature(getattr(ControlPlane, extra)).parameters if p != "who"
        ], extra


async def test_an_embedded_control_plane_serves_a_second_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Embedded(home, local_worker=True, simulate_gpus=1, serve=True) as emb:
        assert emb.url is not None and emb.url.startswith("http://127.0.0.1:")
        owner = read_owner(Layout(home))
        assert owner["url"] == emb.url and owner["token"].startswith("glt_c_")
        assert oct(os.stat(Layout(home).lock).st_mode & 0o777) == "0o600"
        job = await emb.cp.submit(
            JobSpec(name="from-terminal-1", workload=CommandWorkload(argv=["true"]))
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        env["GPULAYER_HOME"] = str(home)
        proc = await __import__("asyncio").create_subprocess_exec(
            *GL, "jobs", "--json", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert [j["id"] for j in json.loads(out)] == [job.id]
        assert (await emb.cp.wait(job.id, timeout=30)).state == JobState.SUCCEEDED
        token = owner["token"]
    assert read_owner(Layout(home)) == {}
    # The published token ended with its owner.
    async with Embedded(home, local_worker=False, serve=True) as again:
        assert again.tokens is not None
        with pytest.raises(Exception, match="revoked"):
            from gpulayer_kernel.security import TokenKind

            await again.tokens.authenticate(token, (TokenKind.CLIENT,))


@pytest.mark.slow  # ~7 s with two xdist workers on two cores
def test_tokens_and_secrets_from_the_cli_without_a_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "home")

    def gl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*GL, *args], capture_output=True, text=True, env=env, input=stdin, timeout=60
        )

    r = gl("token", "create", "--kind", "join", "--ttl", "1h", "--name", "rack")
    assert r.returncode == 0 and r.stdout.startswith("glt_j_"), r.stderr
    token_id = r.stdout.split("_")[2]
    assert "shown only this once" in r.stderr
    listed = gl("token", "list").stdout
    assert token_id in listed and "join" in listed and r.stdout.strip() not in listed
    assert "revoked" in gl("token", "revoke", token_id).stdout
    assert token_id not in gl("token", "list").stdout
    assert token_id in gl("token", "list", "--all").stdout
    bad = gl("token", "create", "--ttl", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    assert gl("secret", "set", "API_KEY", stdin="s3cr3t-value\n").returncode == 0
    assert gl("secret", "list").stdout == "API_KEY\n"
    empty = gl("secret", "set", "EMPTY", stdin="")
    assert empty.returncode == 2 and "no value" in empty.stderr
    assert gl("secret", "delete", "API_KEY").returncode == 0
    assert gl("secret", "delete", "API_KEY").returncode == 2
