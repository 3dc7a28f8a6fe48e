"""A real Jupyter server for the benchmarks, and its kernels driven from outside as a browser does.

``JupyterServer`` runs ``python -m jupyter_server`` isolated from the home folder (its own Jupyter
and IPython folders and ``GPULAYER_HOME`` under a temporary folder, a loopback port, a token);
``WsKernel`` starts a kernel through ``POST /api/kernels`` and runs cells over the kernel's
``/api/kernels/{id}/channels`` WebSocket, timing each from the execute request to the kernel's
idle status, which is what a notebook in JupyterLab waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import tornado.httpclient
import tornado.websocket

ENABLE = "--ServerApp.jpserver_extensions=gpulayer_kernel.jupyter=True"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def isolated_env(base: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GPULAYER_", "JUPYTER_", "JPY_"))
    }
    for name in ("config", "data", "runtime", "ipython", "home"):
        (base / name).mkdir(parents=True, exist_ok=True)
    env.update(
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTER_PLATFORM_DIRS="1",
        IPYTHONDIR=str(base / "ipython"),
        GPULAYER_HOME=str(base / "home"),
        GPULAYER_SESSION_PRELOAD="",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class JupyterServer:
    """``jupyter_server`` in a subprocess of its own session; ``stop()`` ends what it started."""

    def __init__(self, base: Path, env: dict[str, str], *, extension: bool) -> None:
        self.base = base
        self.env = env
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.extension = extension
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def start(self, timeout: float = 90.0) -> JupyterServer:
        root = self.base / "root"
        root.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root}",
            *([ENABLE] if self.extension else []),
        ]
        log = (self.base / "jupyter.log").open("ab")
        self.proc = subprocess.Popen(
            argv, env=self.env, cwd=root, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{self.url}/api/status", headers=self.headers, timeout=2)
                if r.status_code == 200 and (not self.extension or self._gpulayer_up()):
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter_server exited: see {self.base / 'jupyter.log'}")
            time.sleep(0.2)
        raise TimeoutError(f"jupyter_server did not come up: see {self.base / 'jupyter.log'}")

    def _gpulayer_up(self) -> bool:
        r = httpx.get(f"{self.url}/gpulayer/api/v1/status", headers=self.headers, timeout=5)
        return r.status_code == 200

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class WsKernel:
    """One kernel of a Jupyter server, driven over its channels WebSocket (as JupyterLab)."""

    def __init__(self, server: JupyterServer, name: str) -> None:
        self.server = server
        self.name = name
        self.id = ""
        self.session = uuid.uuid4().hex
        self.ws: tornado.websocket.WebSocketClientConnection | None = None

    async def start(self, timeout: float = 300.0) -> float:
        """Start the kernel and run ``1 + 1``; seconds from the start request to the result."""
        t = time.perf_counter()
        async with httpx.AsyncClient(headers=self.server.headers, timeout=timeout) as h:
            r = await h.post(f"{self.server.url}/api/kernels", json={"name": self.name})
            r.raise_for_status()
            self.id = r.json()["id"]
        url = f"ws://127.0.0.1:{self.server.port}/api/kernels/{self.id}/channels"
        request = tornado.httpclient.HTTPRequest(
            f"{url}?session_id={self.session}", headers=self.server.headers
        )
        self.ws = await tornado.websocket.websocket_connect(request)
        assert self.ws.protocol is not None and self.ws.protocol.stream is not None
        self.ws.protocol.stream.set_nodelay(True)  # as a browser's socket: no Nagle delay
        self._sock = self.ws.protocol.stream.socket
        while True:  # until the kernel answers (kernel_info), then the first cell
            try:
                await self.run("1 + 1", timeout=5)
                return time.perf_counter() - t
            except TimeoutError:
                if time.perf_counter() - t > timeout:
                    raise

    async def run(self, code: str, timeout: float = 60.0) -> float:
        """Seconds from the execute request until the kernel is idle again (errors raise)."""
        assert self.ws is not None
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "session": self.session,
                "username": "bench",
                "version": "5.3",
                "date": "",
            },
            "parent_header": {},
            "metadata": {},
            "content": {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
            "channel": "shell",
            "buffers": [],
        }
        start = time.perf_counter()
        await self.ws.write_message(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no idle after {code!r}")
            # Acknowledge at once: jupyter_server's kernel socket keeps Nagle on, and a delayed
            # ACK (40 ms) would hold its next small message back, for every kernel alike.
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise RuntimeError("the kernel's websocket closed")
            got: dict[str, Any] = json.loads(raw)
            if got.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = got["header"]["msg_type"]
            if kind == "error":
                raise RuntimeError(f"cell failed: {got['content']['evalue']}")
            if kind == "status" and got["content"]["execution_state"] == "idle":
                return time.perf_counter() - start

    async def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        async with httpx.AsyncClient(headers=self.server.headers, timeout=60) as h:
            await h.delete(f"{self.server.url}/api/kernels/{self.id}")
