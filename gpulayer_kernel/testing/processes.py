"""Real processes for tests and benchmarks: ``gpulayer serve`` and ``gpulayer worker`` (no pytest).

    with ServeProcess(tmp / "home", heartbeat_timeout=2) as server:
        join = server.create_token("join")
        with WorkerProcess(server.url, join, name="w1", simulate_gpus=2, home=tmp / "w1"):
            env = {**os.environ, **server.client_env()}   # GPULAYER_URL / GPULAYER_TOKEN
            subprocess.run([sys.executable, "-m", "gpulayer_kernel.cli", "run", "--", "true"],
                           env=env)

Each process gets its own session (process group) and its output goes to a log file
(``.log_path``, ``.output()``); leaving the ``with`` block stops it (SIGTERM, then SIGKILL) so no
test leaves processes behind; if the test process dies first, it gets SIGTERM too
(``PR_SET_PDEATHSIG``), and the test reaper (``reaper.py``) ends what is left.
``ServeProcess.restart()`` comes back on the same port and home.
On PostgreSQL (``args=("--db", url)``) a ``ServeProcess(..., standby=True)`` is ready once it
stands by (or leads); ``wait_leading()`` waits until it leads.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

GL = [sys.executable, "-m", "gpulayer_kernel.cli"]
_READY = re.compile(r"gpulayer serve: ready on (\S+)/api/v1")
_UP = re.compile(r"gpulayer serve: (?:ready|standby) on (\S+)/api/v1")
_ADMIN = re.compile(r"admin client token \(shown once, store it now\): (\S+)")
_JOINED = re.compile(r"gpulayer worker: joined \S+ as (\S+) \(id (\w+)")
_SCRUB = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_JOIN_TOKEN", "GPULAYER_SIMULATE_GPUS")


class Daemon:
    """A test engine started by ``with`` (``start``) and stopped when the block ends (``stop``)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _Process(Daemon):
    """A child process in its own session whose output goes to a file."""

    name = "process"

    def __init__(self, log_dir: Path | None, env: dict[str, str] | None) -> None:
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="gpulayer-test-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.log_dir / f"{self.name}.log"
        self._offset = 0

    def _spawn(self, argv: list[str], extra_env: dict[str, str]) -> None:
        base = dict(os.environ if self.env is None else self.env)
        for var in _SCRUB:
            base.pop(var, None)
        base.update(extra_env)
        base.setdefault("PYTHONUNBUFFERED", "1")
        with self.log_path.open("ab") as log:
            self._offset = log.tell()
            self.proc = subprocess.Popen(
                with_pdeathsig(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=base,
                start_new_session=True,
            )

    def output(self) -> str:
        """Everything this object's processes wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            text = self.output()[self._offset :]
            m = pattern.search(text)
            if m:
                return m
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready:\n"
                    + text[-3000:]
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout}s:\n" + text[-3000:])
            time.sleep(0.02)  # a test helper watching a file, not a hot path

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (SIGKILL: no goodbye, like a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the group; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        # Children left in the group (a job's processes) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode


class ServeProcess(_Process):
    """``gpulayer serve`` on 127.0.0.1 with its own home; ``url``, ``admin_token``."""

    name = "serve"

    def __init__(
        self,
        home: Path | str,
        *,
        port: int = 0,
        heartbeat_timeout: float | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        ready_timeout: float = 60.0,
        standby: bool = False,
    ) -> None:
        self.standby = standby
        self.home = Path(home)
        super().__init__(log_dir or self.home.parent / f"{self.home.name}-logs", env)
        self.port = port
        self.heartbeat_timeout = heartbeat_timeout
        self.args = args
        self.ready_timeout = ready_timeout
        self.url = ""
        self.admin_token = ""

    def start(self) -> ServeProcess:
        argv = [*GL, "serve", "--home", str(self.home), "--port", str(self.port), *self.args]
        if self.heartbeat_timeout is not None:
            argv += ["--heartbeat-timeout", str(self.heartbeat_timeout)]
        self._spawn(argv, {"GPULAYER_HOME": str(self.home)})
        m = self._wait_for(_UP if self.standby else _READY, self.ready_timeout)
        self.url = m.group(1)
        self.port = int(self.url.rsplit(":", 1)[1])
        admin = _ADMIN.search(self.output())
        if admin and not self.admin_token:
            self.admin_token = admin.group(1)
        return self

    def wait_leading(self, timeout: float = 30.0) -> ServeProcess:
        """Wait until this (standby) server leads and serves."""
        self._wait_for(_READY, timeout)
        admin = _ADMIN.search(self.output())
        if admin and not self.admin_token:
            self.admin_token = admin.group(1)
        return self

    def restart(self, *, kill: bool = False) -> ServeProcess:
        """Stop (or SIGKILL) and start again on the same port and home."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def client_env(self) -> dict[str, str]:
        return {"GPULAYER_URL": self.url, "GPULAYER_TOKEN": self.admin_token}

    def client(self, **kw: Any) -> Any:
        """A sync ``Client`` with the admin token."""
        from ..client.clients import Client

        return Client(self.url, self.admin_token, **kw)

    def create_token(self, kind: str = "join", ttl: float | None = None) -> str:
        with self.client() as c:
            _, secret = c.create_token(kind, ttl=ttl)
        return str(secret)


class WorkerProcess(_Process):
    """``gpulayer worker`` joining ``url`` with ``join_token``; ``worker_id`` once joined."""

    name = "worker"

    def __init__(
        self,
        url: str,
        join_token: str,
        *,
        name: str = "w1",
        simulate_gpus: int | None = None,
        simulate_kind: str | None = None,
        labels: dict[str, str] | None = None,
        home: Path | str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.home = Path(home) if home else Path(tempfile.mkdtemp(prefix=f"gl-{name}-"))
        self.name = f"worker-{name}"
        super().__init__(self.home, env)
        self.url = url
        self.join_token = join_token
        self.worker_name = name
        self.simulate = (simulate_gpus, simulate_kind)
        self.labels = labels or {}
        self.args = args
        self.ready_timeout = ready_timeout
        self.worker_id = ""

    def start(self) -> WorkerProcess:
        argv = [
            *GL,
            "worker",
            "--server",
            self.url,
            "--name",
            self.worker_name,
            "--work-dir",
            str(self.home / "work"),
            *self.args,
        ]
        if self.simulate[0] is not None:
            argv += ["--simulate-gpus", str(self.simulate[0])]
        if self.simulate[1]:
            argv += ["--simulate-kind", self.simulate[1]]
        if self.labels:
            argv += ["--labels", ",".join(f"{k}={v}" for k, v in self.labels.items())]
        self._spawn(argv, {"GPULAYER_JOIN_TOKEN": self.join_token, "GPULAYER_HOME": str(self.home)})
        self.worker_id = self._wait_for(_JOINED, self.ready_timeout).group(2)
        return self


_SETPRIV = shutil.which("setpriv")


def with_pdeathsig(argv: list[str]) -> list[str]:
    """``argv`` that gets SIGTERM when the process starting it dies (``PR_SET_PDEATHSIG``,
    through util-linux's ``setpriv``, which sets it and execs ``argv``: the pid stays). Only
    from the main thread: the signal follows the *thread* that forked, and a pool thread that
    ends would stop the process with it. Without setpriv, ``argv`` as it is (the test reaper,
    ``reaper.py``, still ends it)."""
    if _SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return argv
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]


def stop_popen(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM a test's daemon, SIGKILL it if it has not exited within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def kill_homes_under(root: Path) -> int:
    """SIGKILL every process whose ``GPULAYER_HOME`` lies under ``root``: the workers a test's
    provider started as "machines" (detached on purpose: a machine outlives the control plane
    that launched it). Returns how many."""
    mark = f"GPULAYER_HOME={root}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(mark) for v in env):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


__all__ = ["GL", "Daemon", "ServeProcess", "WorkerProcess", "kill_homes_under", "stop_popen"]
