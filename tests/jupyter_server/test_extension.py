"""The Jupyter server extension, against real ``jupyter server`` processes.

One server (module scope) serves most tests; the locked-home and shutdown tests start their own.
Each server enables the extension explicitly, so these tests do not depend on how the package was
installed; ``test_installed_extensions_are_enabled_and_ok`` checks the installed configuration.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from gpulayer_kernel.api import USER_ROUTES, WORKER_ROUTES, op_of
from gpulayer_kernel.home import Layout, StateLock
from gpulayer_kernel.testing import wait_until

from .jupyter import JupyterProcess, isolated_env, run_jupyter

pytestmark = pytest.mark.slow

ENABLE = "--ServerApp.jpserver_extensions=gpulayer_kernel.jupyter=True"
METHODS = ("get", "head", "post", "put", "delete")
STATE_CHANGING = {"POST", "PUT", "DELETE"}
SAMPLE = {
    "job_id": "abcd1234",
    "digest": "0" * 64,
    "name:path": "out.txt",
    "name": "SOME_SECRET",
    "worker_id": "abcdef123456",
    "token_id": "abcdef123456",
    "kind": "user",
    "session": "train",
    "number": "1",
    "kernel": "abcdef123456",
}


def operations(routes: tuple[type[Any], ...]) -> list[tuple[str, str]]:
    """(METHOD, concrete path) for every operation of the given handler classes."""
    out = []
    for handler in routes:
        path = re.sub(r"\{([\w:]+)\}", lambda m: SAMPLE[m.group(1)], handler.route)
        for method in METHODS:
            if op_of(getattr(handler, method, None)) is not None:
                out.append((method.upper(), path))
    assert out
    return out


USER_OPS = operations(USER_ROUTES)
WORKER_OPS = operations(WORKER_ROUTES)


def start_server(base: Path, **env: str) -> JupyterProcess:
    return JupyterProcess(
        base, env=isolated_env(base, GPULAYER_SIMULATE_GPUS="2", **env), args=[ENABLE]
    ).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    jp = start_server(tmp_path_factory.mktemp("jupyter"))
    try:
        yield jp
    finally:
        jp.stop()


@pytest.fixture
def http(server: JupyterProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.api, timeout=30) as client:
        yield client


def test_installed_extensions_are_enabled_and_ok(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    servers = run_jupyter(["server", "extension", "list"], env)
    assert re.search(r"gpulayer_kernel\.jupyter\s+enabled", servers), servers
    assert re.search(r"gpulayer_kernel\.jupyter [\d.]+ OK", servers), servers
    labs = run_jupyter(["labextension", "list"], env)
    assert re.search(r"@gpulayer/jupyterlab v[\d.]+ enabled OK", labs), labs


def test_extension_starts_and_registers_no_unauthenticated_route(
    server: JupyterProcess,
) -> None:
    log = server.log()
    assert "GPUlayer control plane in" in log and "is up" in log
    # Jupyter runs with allow_unauthenticated_access=False: it lists every route that neither
    # uses its login nor says that it does not (other extensions have some; we must not).
    unmarked = [line for line in log.splitlines() if re.match(r"\s*- \w+ of \w+ registered", line)]
    assert not [line for line in unmarked if "gpulayer" in line], unmarked


@pytest.mark.parametrize(("method", "path"), USER_OPS)
def test_user_routes_refuse_requests_without_jupyter_auth(
    http: httpx.Client, server: JupyterProcess, method: str, path: str
) -> None:
    for headers in ({}, {"Authorization": "token not-the-token"}):
        r = http.request(method, path, headers=headers, content=b"{}")
        assert r.status_code in (401, 403), (method, path, r.status_code, r.text)
    # A GPUlayer client token is not Jupyter's login: user routes inside Jupyter ignore it.
    owner = server.owner()
    r = http.request(method, path, headers={"Authorization": f"Bearer {owner['token']}"})
    assert r.status_code in (401, 403), (method, path, r.status_code, r.text)


def login_cookies(server: JupyterProcess) -> httpx.Client:
    """A browser-like client, logged in by cookie through Jupyter's login form (token as the
    password), holding the ``_xsrf`` cookie as a page would."""
    client = httpx.Client(base_url=server.url, timeout=30, follow_redirects=True)
    try:
        assert client.get("login").status_code == 200
        xsrf = client.cookies["_xsrf"]
        r = client.post("login", data={"password": server.token, "_xsrf": xsrf})
        assert r.status_code == 200, r.text
        assert any(c.startswith("username-") for c in client.cookies), client.cookies
    except BaseException:
        client.close()
        raise
    return client


def test_cookie_requests_without_xsrf_are_refused(server: JupyterProcess) -> None:
    with contextlib.closing(login_cookies(server)) as browser:
        base = "gpulayer/api/v1"
        # Reading with the login cookie works: this is the panel's own path.
        assert browser.get(f"{base}/workers").status_code == 200
        for method, path in USER_OPS:
            if method not in STATE_CHANGING:
                continue
            r = browser.request(method, f"{base}{path}", content=b"{}")
            assert r.status_code == 403, (method, path, r.status_code, r.text)
            assert "xsrf" in r.text.lower(), r.text
        # With the XSRF header (as JupyterLab's ServerConnection sends it) the same works.
        spec = {"name": "xsrf-ok", "workload": {"kind": "command", "argv": ["true"]}}
        r = browser.post(
            f"{base}/jobs", json=spec, headers={"X-XSRFToken": browser.cookies["_xsrf"]}
        )
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(("method", "path"), WORKER_OPS)
def test_worker_routes_accept_only_gpulayer_worker_tokens(
    http: httpx.Client, server: JupyterProcess, method: str, path: str
) -> None:
    jupyter = http.request(method, path, headers=server.headers, content=b"{}")
    assert jupyter.status_code == 401, (method, path, jupyter.status_code, jupyter.text)
    with contextlib.closing(login_cookies(server)) as browser:
        cookie = browser.request(
            method,
            f"gpulayer/api/v1{path}",
            headers={"X-XSRFToken": browser.cookies["_xsrf"]},
            content=b"{}",
        )
    assert cookie.status_code == 401, (method, path, cookie.status_code, cookie.text)
    client = http.request(
        method, path, headers={"Authorization": f"Bearer {server.owner()['token']}"}
    )
    assert client.status_code == 403, (method, path, client.status_code, client.text)
    assert client.json()["code"] == "wrong_token_kind"


def test_health_needs_no_login_inside_jupyter(http: httpx.Client, server: JupyterProcess) -> None:
    r = http.get("/health", headers={})
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text


def test_a_remote_worker_joins_through_jupyter(http: httpx.Client, server: JupyterProcess) -> None:
    # An operator makes a join token through the user routes (Jupyter's login) ...
    r = http.post("/tokens", json={"kind": "join", "name": "test"}, headers=server.headers)
    assert r.status_code == 201, r.text
    join = r.json()["secret"]
    # ... and a worker elsewhere joins with it, through the Jupyter server's address.
    reg = {"name": "remote-box", "capabilities": {"simulated": True}}
    r = http.post("/workers/join", json=reg, headers={"Authorization": f"Bearer {join}"})
    assert r.status_code == 200, r.text
    session = {"Authorization": f"Bearer {r.json()['session_token']}"}
    assert http.post("/worker/heartbeat", headers=session).status_code == 200
    names = [w["name"] for w in http.get("/workers", headers=server.headers).json()["workers"]]
    assert "remote-box" in names
    assert http.post("/worker/leave", headers=session).status_code == 204


def test_a_job_submitted_through_jupyter_runs_on_the_local_worker(
    http: httpx.Client, server: JupyterProcess
) -> None:
    workers = http.get("/workers", headers=server.headers).json()["workers"]
    local = [w for w in workers if w["transport"] == "inprocess"]
    assert len(local) == 1 and len(local[0]["capabilities"]["devices"]) == 2
    spec = {
        "name": "hello",
        "workload": {"kind": "command", "argv": ["python3", "-c", "print('hello from a job')"]},
        "resources": {"gpus": 1},
    }
    r = http.post("/jobs", json=spec, headers=server.headers)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    job = http.get(f"/jobs/{job_id}/wait", params={"timeout": 60}, headers=server.headers).json()
    assert job["state"] == "succeeded", job
    assert job["placement"]["nodes"][0]["worker_id"] == local[0]["id"]
    assert job["placement"]["nodes"][0]["simulated"] is True
    logs = http.get(f"/jobs/{job_id}/logs", headers=server.headers).json()
    assert "hello from a job" in [rec["text"] for rec in logs["records"]]


def test_kernels_get_a_loopback_url_and_a_client_token(
    http: httpx.Client, server: JupyterProcess
) -> None:
    owner = server.owner()
    assert owner["url"].startswith("http://127.0.0.1:")
    assert owner["token"].startswith("glt_c_")
    mode = (Path(server.env["GPULAYER_HOME"]) / "controlplane.lock").stat().st_mode
    assert mode & 0o077 == 0
    # The loopback listener speaks GPUlayer client tokens, like `gpulayer serve` ...
    status = httpx.get(
        f"{owner['url']}/api/v1/status", headers={"Authorization": f"Bearer {owner['token']}"}
    )
    assert status.status_code == 200, status.text
    # ... and nothing else.
    assert httpx.get(f"{owner['url']}/api/v1/status", headers=server.headers).status_code == 401
    # A kernel started by this server inherits both (its environment is the server's).
    r = httpx.post(f"{server.url}api/kernels", headers=server.headers, json={"name": "python3"})
    assert r.status_code == 201, r.text
    kernel_id = r.json()["id"]
    try:
        env = kernel_environ(server, kernel_id)
        assert env["GPULAYER_URL"] == owner["url"]
        assert env["GPULAYER_TOKEN"] == owner["token"]
        assert env["GPULAYER_HOME"] == server.env["GPULAYER_HOME"]
    finally:
        httpx.delete(f"{server.url}api/kernels/{kernel_id}", headers=server.headers)


def kernel_environ(server: JupyterProcess, kernel_id: str) -> dict[str, str]:
    found: dict[str, str] = {}

    def started() -> bool:
        for proc in server.children():
            with contextlib.suppress(psutil.Error):
                if any(kernel_id in part for part in proc.cmdline()):
                    found.update(proc.environ())
                    return True
        return False

    wait_until(started, 30, what=f"a kernel process for {kernel_id}")
    return found


def test_a_locked_home_gives_503_with_the_reason_and_jupyter_keeps_running(
    tmp_path: Path,
) -> None:
    env = isolated_env(tmp_path, GPULAYER_SIMULATE_GPUS="2")
    lock = StateLock(Layout(Path(env["GPULAYER_HOME"])))
    Path(env["GPULAYER_HOME"]).mkdir(parents=True, exist_ok=True)
    lock.acquire()  # this test process plays "another server / gpulayer run"
    try:
        with JupyterProcess(tmp_path, env=env, args=[ENABLE]) as jp:
            r = httpx.get(f"{jp.api}/workers", headers=jp.headers)
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["code"] == "home_locked"
            assert "in use by another GPUlayer control plane" in body["message"]
            assert body["hint"]
            # Unauthenticated callers learn nothing, and workers only that it is not running.
            assert httpx.get(f"{jp.api}/workers").status_code == 403
            worker = httpx.post(f"{jp.api}/worker/heartbeat", headers={"Authorization": "x"})
            assert worker.status_code == 503 and worker.json()["code"] == "not_running"
            health = httpx.get(f"{jp.api}/health")
            assert health.status_code == 503 and health.json()["code"] == "not_running"
            # Jupyter itself is fine, and its log says why GPUlayer is not.
            assert httpx.get(f"{jp.url}api/status", headers=jp.headers).status_code == 200
            assert "in use by another GPUlayer control plane" in jp.log()
    finally:
        lock.release()


def test_shutdown_stops_jobs_and_releases_the_home(tmp_path: Path) -> None:
    jp = start_server(tmp_path)
    try:
        marker = f"gl-shutdown-{time.monotonic_ns()}"
        spec = {
            "name": "sleeper",
            "workload": {
                "kind": "command",
                "argv": [
                    "python3",
                    "-c",
                    "import time; print('up', flush=True); time.sleep(300)",
                    marker,
                ],
            },
        }
        r = httpx.post(f"{jp.api}/jobs", json=spec, headers=jp.headers)
        assert r.status_code == 201, r.text
        logs = httpx.get(
            f"{jp.api}/jobs/{r.json()['id']}/logs",
            params={"wait": 30, "since": 0},
            headers=jp.headers,
            timeout=40,
        )
        assert logs.status_code == 200
        wait_until(lambda: job_processes(marker), 30, what="the job's process")
    finally:
        jp.stop()
    assert "stopped" in jp.log()
    assert not job_processes(marker)
    lock = StateLock(Layout(Path(jp.env["GPULAYER_HOME"])))
    lock.acquire()  # the home is free again
    lock.release()


def job_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if marker in (proc.info["cmdline"] or []):
                found.append(proc)
    return found


def test_traitlets_choose_the_home_and_the_local_worker(tmp_path: Path) -> None:
    home = tmp_path / "configured-home"
    args = [ENABLE, f"--GPUlayer.home={home}", "--GPUlayer.local_worker=False"]
    with JupyterProcess(tmp_path, args=args) as jp:
        owner = json.loads((home / "controlplane.lock").read_text())
        assert owner["url"].startswith("http://127.0.0.1:")
        assert not (Path(jp.env["GPULAYER_HOME"]) / "controlplane.lock").exists()
        workers = httpx.get(f"{jp.api}/workers", headers=jp.headers).json()["workers"]
        assert workers == []


def test_the_lab_extension_version_is_the_package_version() -> None:
    # package.json is the one place the version is written (hatch-nodejs-version reads it).
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[2]
    package = json.loads((root / "package.json").read_text())
    assert package["version"] == version("gpulayer")
    assert package["jupyterlab"]["outputDir"] == "gpulayer_kernel/labextension"
