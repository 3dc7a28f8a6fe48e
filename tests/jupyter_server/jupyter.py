"""A real ``jupyter server`` / ``jupyter lab`` in a subprocess, isolated from the home folder.

Used by the server-extension tests and the browser tests. Each process gets its own Jupyter
config/data/runtime folders, IPython folder and ``GPULAYER_HOME`` under the test's tmp folder, a
random loopback port and a random token, and runs in its own session so that ``stop()`` can make
sure nothing it started (kernels, job processes) outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import psutil  # type: ignore[import-untyped]

from gpulayer_kernel.testing import wait_until

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def isolated_env(base: Path, **extra: str) -> dict[str, str]:
    """The environment of a Jupyter started by a test: nothing read from or written to ~."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPULAYER_", "JUPYTER_", "JPY_")) and k != "PYTEST_CURRENT_TEST"
    }
    for name in ("config", "data", "runtime", "ipython", "yarn", "home", "settings"):
        (base / name).mkdir(parents=True, exist_ok=True)
    env.update(
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(base / "settings"),
        JUPYTER_PLATFORM_DIRS="1",
        IPYTHONDIR=str(base / "ipython"),
        YARN_GLOBAL_FOLDER=str(base / "yarn"),
        GPULAYER_HOME=str(base / "home"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def lab_settings(settings_dir: Path, theme: str | None = None) -> None:
    """User settings for screenshots: no news or update toasts; optionally a theme."""
    notif = settings_dir / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True, exist_ok=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    if theme:
        (notif / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))


class JupyterProcess:
    """``python -m jupyter_server`` or ``python -m jupyterlab`` with GPUlayer's extension."""

    def __init__(
        self,
        base: Path,
        *,
        app: str = "server",
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
        token: str | None = None,
        name: str = "jupyter",
    ) -> None:
        self.base = base
        self.app = app
        self.env = dict(env) if env is not None else isolated_env(base)
        self.args = list(args)
        self.port = port or free_port()
        self.token = token or secrets.token_hex(16)
        self.root = base / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = base / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def api(self) -> str:
        return f"{self.url}gpulayer/api/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def command(self) -> list[str]:
        module = "jupyterlab" if self.app == "lab" else "jupyter_server"
        return [
            sys.executable,
            "-m",
            module,
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--FileContentsManager.delete_to_trash=False",
            "--ServerApp.allow_unauthenticated_access=False",
            *self.args,
        ]

    def start(self, *, ready: bool = True, timeout: float = 60.0) -> Self:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.command(),
            env=self.env,
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.wait_http(timeout)
        if ready:
            self.wait_gpulayer(timeout)
        return self

    def wait_http(self, timeout: float) -> None:
        def answering() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.app} exited early:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"{self.url}api/status", headers=self.headers, timeout=2)
                return r.status_code == 200
            return False

        try:
            wait_until(answering, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self.app} did not answer within {timeout}s:\n{self.log()}"
            ) from None

    def wait_gpulayer(self, timeout: float) -> httpx.Response:
        """Until the extension has started (or failed to): no more 503 ``starting``."""
        last: list[httpx.Response] = []

        def started() -> bool:
            r = httpx.get(f"{self.api}/status", headers=self.headers, timeout=5)
            last[:] = [r]
            return r.status_code != 503 or r.json().get("code") != "starting"

        try:
            wait_until(started, timeout)
        except TimeoutError:
            raise TimeoutError(f"GPUlayer did not start within {timeout}s:\n{self.log()}") from None
        return last[0]

    def owner(self) -> dict[str, Any]:
        """What the extension published in the state directory's lock file."""
        text = (Path(self.env["GPULAYER_HOME"]) / "controlplane.lock").read_text() or "{}"
        data: dict[str, Any] = json.loads(text)
        return data

    def log(self) -> str:
        try:
            return ANSI.sub("", self.log_path.read_text(errors="replace"))
        except OSError:
            return ""

    def children(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        with contextlib.suppress(psutil.Error):
            children: list[psutil.Process] = psutil.Process(self.proc.pid).children(recursive=True)
            return children
        return []

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Jupyter's clean shutdown, which stops GPUlayer), then make sure of it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        leftovers = []
        with contextlib.suppress(psutil.Error):
            leftovers = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for child in leftovers:
            with contextlib.suppress(psutil.Error):
                child.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_jupyter(args: Sequence[str], env: Mapping[str, str], timeout: float = 60) -> str:
    """``jupyter ARGS`` (e.g. ``server extension list``) → its output without colours."""
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return ANSI.sub("", out.stdout + out.stderr)
