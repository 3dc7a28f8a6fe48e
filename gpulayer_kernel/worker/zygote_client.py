"""The worker's side of the warm runner: a client of the fork server in ``zygote.py``.

:class:`WarmRunner` is one worker's zygote, owned by its agent and handed to each executor: it
starts the fork server on the first Python job, replaces it when it dies, gives up (warning once)
when it cannot start, and stops it with the worker. :class:`ZygoteClient` speaks the protocol that
``zygote.py`` describes; :class:`ZygoteChild` is a forked job, shaped like an asyncio ``Process``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

from .. import job
from ..clock import SYSTEM_CLOCK, Clock
from . import reaper
from .config import ExecutorConfig
from .env import base_env
from .zygote import MAX_MSG, PACKAGE_ROOT, PRELOAD_ENV, SLOT_LEN, STARTUP_VARS

log = logging.getLogger("gpulayer.worker")

START_TIMEOUT = 30.0  # seconds for the zygote to import what it preloads and say "ready"
SPAWN_TIMEOUT = 10.0  # seconds for the zygote to answer a launch with a pid
CLOSE_WAIT = 2.0  # seconds a hung-up zygote gets to exit on its own before SIGKILL
REAP_WAIT = 0.5  # seconds a zygote that closed its socket gets to finish exiting


class ZygoteUnavailable(Exception):
    """The zygote could not start or launch: the caller uses the cold spawn."""


class ZygoteChild:
    """A job process forked by the zygote, shaped like :class:`asyncio.subprocess.Process`."""

    def __init__(
        self,
        pid: int,
        exited: asyncio.Future[int],
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self.pid = pid
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self._exited = exited
        self._transports = transports

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        """The exit status the zygote reported (it reaped the process; we are not its parent)."""
        return await asyncio.shield(self._exited)

    def close(self) -> None:
        """Close the pipes' read ends (a grandchild outside the group may still hold them)."""
        for t in self._transports:
            t.close()


class ZygoteClient:
    """The worker's handle on one zygote process, bound to the event loop that started it."""

    def __init__(
        self,
        python: str,
        preload: tuple[str, ...],
        env: dict[str, str],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.python = python
        self.preload = preload
        self._env = env
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.zygote_pid: int | None = None
        self._ready: asyncio.Future[int] = self.loop.create_future()
        self._launches: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._next_id = 0
        self.dead = False
        self._closed = False

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self._env)
        env["PYTHONPATH"] = PACKAGE_ROOT
        env[job.JOB_ID_ENV] = "-" * SLOT_LEN  # the slot each child overwrites with its job id
        argv = [self.python, "-m", "gpulayer_kernel.worker.zygote", str(theirs.fileno())]
        argv += [str(os.getpid()), ",".join(self.preload)]
        try:
            # Spawned from the event loop's thread, never a helper thread: PR_SET_PDEATHSIG fires
            # when the *thread* that forked the zygote exits. Blocks the loop a few ms, once.
            self.proc = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ZygoteUnavailable(f"could not start {self.python}: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.loop.add_reader(ours.fileno(), self._readable)
        try:
            if not await self.clock.wait_for(self._ready, START_TIMEOUT):
                raise ZygoteUnavailable("timed out")
            self.zygote_pid = self._ready.result()
        except ZygoteUnavailable as exc:
            self.close()
            raise ZygoteUnavailable(f"the warm runner did not start: {exc}") from exc

    def _readable(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(MAX_MSG)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._died()
                return
            msg = json.loads(data)
            if "exit" in msg:
                self._exit_future(int(msg["exit"])).set_result(int(msg["code"]))
            elif "ready" in msg:
                self._ready.set_result(int(msg["ready"]))
            elif "fatal" in msg and not self._ready.done():
                self._ready.set_exception(ZygoteUnavailable(msg["fatal"]))
            else:
                fut = self._launches.pop(int(msg.get("id") or -1), None)
                if fut is not None and not fut.done():
                    if "pid" in msg:
                        fut.set_result(int(msg["pid"]))
                    else:
                        fut.set_exception(ZygoteUnavailable(str(msg.get("error"))))

    def _exit_future(self, pid: int) -> asyncio.Future[int]:
        fut = self._exits.get(pid)
        if fut is None:
            fut = self._exits[pid] = self.loop.create_future()
        return fut

    def _died(self) -> None:
        """EOF from the zygote: it is gone, and (pdeathsig) so are the jobs it forked."""
        was_dead, self.dead = self.dead, True
        if self.sock is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        self._fail_pending("it exited")
        if not was_dead and self.zygote_pid is not None:
            log.warning(
                "the warm runner (pid %s) exited; its running jobs died with it", self.zygote_pid
            )
        # EOF arrives while the zygote exits (its fds close before it becomes a zombie): wait
        # the moment that takes, here, so that no owner has to remember to collect it later.
        self._reap_zygote(wait=REAP_WAIT)

    def _fail_pending(self, why: str) -> None:
        """Answer every waiter: start-up and launches fail, running jobs read as SIGKILL."""
        if not self._ready.done():
            self._ready.set_exception(ZygoteUnavailable(f"{why} during start-up"))
            self._ready.exception()  # retrieved: start() reports it, if anyone still waits
        for fut in self._launches.values():
            if not fut.done():
                fut.set_exception(ZygoteUnavailable(why))
        for fut in self._exits.values():
            if not fut.done():
                fut.set_result(-signal.SIGKILL)

    def _reap_zygote(self, wait: float) -> None:
        """Collect the zygote's exit status, killing it after ``wait`` seconds: always reaped."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            return
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()

    async def spawn(
        self, entrypoint: str, cwd: Path, env: dict[str, str], stdin: int | None = None
    ) -> ZygoteChild:
        """Fork one Python job: stdout/stderr come back as StreamReaders, as with a cold spawn.

        ``stdin``: an fd the job gets as its stdin (a session's socket); default /dev/null."""
        return await self._launch({"entrypoint": entrypoint}, cwd, env, stdin)

    async def exec(self, argv: list[str], cwd: Path, env: dict[str, str]) -> ZygoteChild:
        """Fork one job that execs ``argv`` (a command, or a launcher), supervised as the rest."""
        return await self._launch({"argv": argv}, cwd, env)

    async def _launch(
        self, what: dict[str, object], cwd: Path, env: dict[str, str], stdin: int | None = None
    ) -> ZygoteChild:
        if self.dead or self.sock is None:
            raise ZygoteUnavailable("not running")
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[int] = self.loop.create_future()
        self._launches[rid] = fut
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = (
            os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            if stdin is None
            else os.dup(stdin)  # closed below like /dev/null: the caller keeps its own
        )
        request = {"id": rid, **what, "cwd": str(cwd), "env": env}
        try:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [null, out_w, err_w])
            except OSError as exc:  # full buffer, or the zygote is gone
                raise ZygoteUnavailable(f"launch request failed: {exc}") from exc
            finally:
                for fd in (null, out_w, err_w):
                    os.close(fd)
            if not await self.clock.wait_for(fut, SPAWN_TIMEOUT):
                self.close()  # if it forked after all, the job dies with it (pdeathsig)
                raise ZygoteUnavailable("no answer to a launch request")
            pid = fut.result()
        except BaseException as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            if isinstance(exc, asyncio.CancelledError):
                # Cancelled mid-launch: the job may start anyway; stop it when its pid arrives.
                fut.add_done_callback(_kill_launched)
            else:
                self._launches.pop(rid, None)
            raise
        readers: list[asyncio.StreamReader] = []
        transports: list[asyncio.BaseTransport] = []
        for fd in (out_r, err_r):
            reader = asyncio.StreamReader(limit=2**16)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await self.loop.connect_read_pipe(
                lambda p=protocol: p,  # type: ignore[misc]
                open(fd, "rb", buffering=0),
            )
            readers.append(reader)
            transports.append(transport)
        return ZygoteChild(pid, self._exit_future(pid), readers[0], readers[1], transports)

    def close(self) -> None:
        """Hang up and reap the zygote (it exits on EOF, taking any running job with it).

        Idempotent, and safe from any thread or after the loop closed: once it returns, the
        zygote's process is collected (no "subprocess is still running" left for the GC).
        """
        if self._closed:
            return
        self._closed = True
        if self.sock is not None and not self.dead:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        self.dead = True
        self._reap_zygote(wait=CLOSE_WAIT)
        # Futures belong to their loop's thread: from elsewhere (a GC finalizer, a closed loop)
        # nobody can be waiting on them any more.
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is self.loop:
                self._fail_pending("it was closed")


def env_preload() -> tuple[str, ...]:
    """The modules ``GPULAYER_ZYGOTE_PRELOAD`` names (comma-separated; none by default)."""
    return tuple(m.strip() for m in os.environ.get(PRELOAD_ENV, "").split(",") if m.strip())


SESSION_PRELOAD_ENV = "GPULAYER_SESSION_PRELOAD"
"""Worker setting: the modules a session's zygote imports besides IPython (default: torch and
numpy where installed; set it empty for IPython alone)."""


def session_preload() -> tuple[str, ...]:
    """What a session's zygote imports: IPython's shell and the session host, then torch and
    numpy where this interpreter has them (``GPULAYER_SESSION_PRELOAD`` overrides the two)."""
    import importlib.util

    base = ("IPython.core.interactiveshell", "gpulayer_kernel.worker.session_host")
    configured = os.environ.get(SESSION_PRELOAD_ENV)
    if configured is not None:
        extra = tuple(m.strip() for m in configured.split(",") if m.strip())
    else:
        extra = tuple(m for m in ("torch", "numpy") if importlib.util.find_spec(m) is not None)
    return base + extra


def _kill_launched(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(fut.result(), signal.SIGKILL)


class WarmRunner:
    """One worker's zygote: started by its first Python job, replaced if it dies, stopped with it.

    The agent owns it and hands it to every executor, so each worker has its own fork server (with
    its own ``python`` and allow-listed environment), and stopping a worker stops its zygote.
    """

    def __init__(
        self,
        config: ExecutorConfig,
        clock: Clock = SYSTEM_CLOCK,
        preload: Callable[[], tuple[str, ...]] | None = None,
    ) -> None:
        """``preload``: the modules its zygote imports up front (default: ``PRELOAD_ENV``'s)."""
        self.config = config
        self.clock = clock
        self._preload = preload or env_preload
        self._client: ZygoteClient | None = None
        self._finalizer: weakref.finalize[[], WarmRunner] | None = None
        self._broken = False  # a failed start is likely to fail again: stop trying
        self._warned = False
        self.closed = False  # closed by its owner: no zygote is started any more

    @property
    def pid(self) -> int | None:
        """The pid of the live zygote, if any (for tests and diagnostics)."""
        client = self._client
        return client.zygote_pid if client is not None and not client.dead else None

    async def spawn(
        self, entrypoint: str, cwd: Path, env: dict[str, str], stdin: int | None = None
    ) -> ZygoteChild | None:
        """Launch a Python job through the zygote; None means "use the cold spawn"."""
        if any(k in STARTUP_VARS for k in env):
            return None
        return await self._launch(lambda c: c.spawn(entrypoint, cwd, env, stdin))

    async def exec(self, argv: list[str], cwd: Path, env: dict[str, str]) -> ZygoteChild | None:
        """Launch a command through the zygote (no interpreter start-up in the way of its
        supervisor); None means "use the cold spawn"."""
        return await self._launch(lambda c: c.exec(argv, cwd, env))

    async def _launch(
        self, launch: Callable[[ZygoteClient], Awaitable[ZygoteChild]]
    ) -> ZygoteChild | None:
        if self.closed:
            return None
        try:
            client = await self._running()
            child = await launch(client)
        except ZygoteUnavailable as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "warm runner unavailable (%s); jobs start from a fresh interpreter", exc
                )
            return None
        if self.closed:  # closed while this launch was under way: it must not outlive us
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, reaper.STOP)
            child.close()
            return None
        return child

    async def _running(self) -> ZygoteClient:
        if self._broken:
            raise ZygoteUnavailable("it failed to start before")
        preload = self._preload()
        client = self._client
        if client is not None and not (
            client.dead
            or client.loop is not asyncio.get_running_loop()
            or client.python != self.config.python
            or client.preload != preload
        ):
            return client
        self._drop()
        # The zygote starts from the allow-listed worker environment: no secrets in its memory.
        env = base_env(extra_allowed=self.config.extra_env_allowed)
        client = self._client = ZygoteClient(self.config.python, preload, env, self.clock)
        # A worker dropped without stop() still hangs up on its zygote when it is collected.
        self._finalizer = weakref.finalize(self, client.close)
        try:
            await client.start()
        except ZygoteUnavailable:
            self._broken = True
            raise
        return client

    def close(self) -> None:
        """Stop and reap the zygote now (and any job still running in it), for good.

        Called by its owner (the agent's ``stop``); idempotent. Jobs launched afterwards take
        the cold spawn, so no zygote is started behind a closed owner's back.
        """
        self.closed = True
        self._drop()

    def _drop(self) -> None:
        """Stop the current zygote (a later job starts a new one)."""
        if self._finalizer is not None:
            self._finalizer()  # closes the client, once
            self._finalizer = None
        self._client = None
