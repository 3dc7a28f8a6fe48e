"""The worker's handle on one fork server (``zygote.py``): :class:`ZygoteClient`.

It starts the zygote, speaks the protocol ``zygote.py`` describes, launches jobs through it and
keeps its spares: job processes forked ahead of time that a Python job is handed to
(``spares.py``). Which zygotes a worker runs, and when, is its warm runner's business
(``warm.py``). The process it starts stays behind as the zygote's keeper (``reaper.py``): the
zygote is the keeper's child, so ``proc`` is the keeper (the one we reap) and ``zygote_pid``
the zygote (it says so when ready).
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
from collections import deque
from pathlib import Path

from .. import job
from ..clock import SYSTEM_CLOCK, Clock
from . import reaper
from .spares import Pipes, Spare, ZygoteChild
from .zygote import MAX_MSG, PACKAGE_ROOT, SLOT_LEN

__all__ = ["LaunchFailed", "ZygoteChild", "ZygoteClient", "ZygoteUnavailable"]

log = logging.getLogger("gpulayer.worker")

START_TIMEOUT = 30.0  # seconds for the zygote to import what it preloads and say "ready"
SPAWN_TIMEOUT = 10.0  # seconds for the zygote to answer a launch with a pid
CLOSE_WAIT = 2.0  # seconds a hung-up zygote gets to exit on its own before SIGKILL
REAP_WAIT = 0.5  # seconds a zygote that closed its socket gets to finish exiting
KEEPER_WAIT = 2.0  # seconds the keeper gets to kill everything below it once told to stop
REPLENISH_AFTER = 0.1  # seconds after a use before a spare is replaced, while another is ready


class ZygoteUnavailable(Exception):
    """The zygote could not start or launch: the caller uses the cold spawn."""


class LaunchFailed(Exception):
    """The zygote is fine, the command is not: it cannot be executed (``code``: 127 not found,
    126 not executable, as a shell says). The job fails with it; no fallback would do better."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ZygoteClient:
    """The worker's handle on one zygote process, bound to the event loop that started it.

    ``pool``: how many spares it keeps (0: every job is forked when it is launched).
    """

    def __init__(
        self,
        python: str,
        preload: tuple[str, ...],
        env: dict[str, str],
        clock: Clock = SYSTEM_CLOCK,
        pool: int = 0,
    ) -> None:
        self.python = python
        self.preload = preload
        self.pool = pool
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
        self.spares: deque[Spare] = deque()
        # Spares by supervisor pid: "idle" (in ``spares``), "handing" (being given a job), "job"
        # (running one), "dropped" (died idle, or hung): their exits ask for a replacement.
        self._spare_state: dict[int, str] = {}
        self.dead = False
        self._closed = False

    @property
    def ready(self) -> bool:
        return self._ready.done() and not self._ready.exception() and not self.dead

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
        self._ask(self.pool)

    def _ask(self, n: int) -> None:
        """Ask the zygote to fork ``n`` spares (they arrive as ``spare`` messages)."""
        if n <= 0 or self.dead or self.sock is None:
            return
        with contextlib.suppress(OSError):  # gone: its EOF says so
            self.sock.send(json.dumps({"spares": n}).encode())

    def _readable(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MSG, 1)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                self._died()
                return
            msg = json.loads(data)
            if "spare" in msg:
                self._spare_arrived(int(msg["spare"]), fds)
            elif "exit" in msg:
                self._exited(int(msg["exit"]), int(msg["code"]))
            elif "ready" in msg:
                self._ready.set_result(int(msg["ready"]))
            elif "fatal" in msg and not self._ready.done():
                self._ready.set_exception(ZygoteUnavailable(msg["fatal"]))
            else:
                fut = self._launches.pop(int(msg.get("id") or -1), None)
                if fut is not None and not fut.done():
                    if "pid" in msg:
                        fut.set_result(int(msg["pid"]))
                    elif "failed" in msg:
                        fut.set_exception(LaunchFailed(int(msg["failed"]), str(msg["error"])))
                    else:
                        fut.set_exception(ZygoteUnavailable(str(msg.get("error"))))

    def _spare_arrived(self, pid: int, fds: list[int]) -> None:
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return
        spare = Spare(pid, socket.socket(fileno=fds[0]))
        if self._closed or self.dead:
            spare.close()
            return
        self._spare_state[pid] = "idle"
        self.spares.append(spare)

    def _exited(self, pid: int, code: int) -> None:
        state = self._spare_state.pop(pid, None)
        if state == "idle":  # died while idle (killed, OOM): never handed a job
            for spare in [s for s in self.spares if s.pid == pid]:
                self.spares.remove(spare)
                spare.close()
            log.info("a spare job process (pid %s) died while idle; replacing it", pid)
        elif state != "dropped":
            fut = self._exits.pop(pid, None)
            if fut is None:  # nobody waits yet: kept, done, for the launch that comes back
                fut = self._exits[pid] = self.loop.create_future()
            if not fut.done():
                fut.set_result(code)
        if state is not None:
            # Replenished after each use (or loss), off the next job's path: a moment later
            # while another spare is ready (forking a torch-loaded spare is CPU the control
            # plane wants just now, to deliver this job's end), at once when none is.
            if self.spares:
                self.loop.call_later(REPLENISH_AFTER, self._ask, 1)
            else:
                self._ask(1)

    def _exit_future(self, pid: int) -> asyncio.Future[int]:
        """The exit status of ``pid``, for the one who launched it (registered until known)."""
        fut = self._exits.get(pid)
        if fut is None:
            fut = self._exits[pid] = self.loop.create_future()
        elif fut.done():
            del self._exits[pid]  # it exited before its launch came back: taken now
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
        while self.spares:
            self.spares.popleft().close()
        for fut in self._launches.values():
            if not fut.done():
                fut.set_exception(ZygoteUnavailable(why))
        for fut in self._exits.values():
            if not fut.done():
                fut.set_result(-signal.SIGKILL)

    def _reap_zygote(self, wait: float) -> None:
        """Collect the zygote's keeper (the process we started), stopping it after ``wait``
        seconds (it kills everything below it first): always reaped."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            return
        with contextlib.suppress(OSError):
            proc.send_signal(reaper.STOP)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(KEEPER_WAIT)
            return
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()

    async def spawn(
        self,
        entrypoint: str,
        cwd: Path,
        env: dict[str, str],
        stdin: int | None = None,
        sources: dict[str, str] | None = None,
    ) -> ZygoteChild:
        """Start one Python job: handed to a spare when one is idle, else forked now.
        stdout/stderr come back as StreamReaders, as with a cold spawn.

        ``stdin``: an fd the job gets as its stdin (a session's socket); default /dev/null.
        ``sources``: files the runner takes from memory instead of ``cwd`` (a cell's source).
        """
        what: dict[str, object] = {"entrypoint": entrypoint}
        if sources:
            what["sources"] = sources
        while self.spares and not self.dead:
            child = await self._hand(self.spares.popleft(), what, cwd, env, stdin)
            if child is not None:
                return child
        return await self._launch(what, cwd, env, stdin)

    async def _hand(
        self,
        spare: Spare,
        what: dict[str, object],
        cwd: Path,
        env: dict[str, str],
        stdin: int | None,
    ) -> ZygoteChild | None:
        """Give a spare its job; None when it turned out dead (it is dropped, never used)."""
        self._spare_state[spare.pid] = "handing"
        pipes = Pipes(stdin)
        exited = self._exit_future(spare.pid)
        try:
            took = await spare.hand({**what, "cwd": str(cwd), "env": env}, pipes, self.clock)
        except BaseException:
            pipes.abandon()
            spare.close()
            self._spare_state[spare.pid] = "dropped"
            raise
        if not took:
            pipes.abandon()
            if self._spare_state.get(spare.pid) == "handing":
                self._spare_state[spare.pid] = "dropped"  # its exit asks for a replacement
            self._exits.pop(spare.pid, None)
            return None
        pipes.sent()
        if self._spare_state.get(spare.pid) == "handing":
            self._spare_state[spare.pid] = "job"
        return await pipes.child(spare.pid, exited)

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
        pipes = Pipes(stdin)
        request = {"id": rid, **what, "cwd": str(cwd), "env": env}
        try:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], pipes.theirs)
            except OSError as exc:  # full buffer, or the zygote is gone
                raise ZygoteUnavailable(f"launch request failed: {exc}") from exc
            finally:
                pipes.sent()
            if not await self.clock.wait_for(fut, SPAWN_TIMEOUT):
                self.close()  # if it forked after all, the job dies with it (pdeathsig)
                raise ZygoteUnavailable("no answer to a launch request")
            pid = fut.result()
        except BaseException as exc:
            pipes.abandon()
            if isinstance(exc, asyncio.CancelledError):
                # Cancelled mid-launch: the job may start anyway; stop it when its pid arrives.
                fut.add_done_callback(_kill_launched)
            else:
                self._launches.pop(rid, None)
            raise
        return await pipes.child(pid, self._exit_future(pid))

    def close(self) -> None:
        """Hang up and reap the zygote (it exits on EOF, taking any running job with it).

        Idempotent, and safe from any thread or after the loop closed: once it returns, the
        zygote's process is collected (no "subprocess is still running" left for the GC).
        """
        if self._closed:
            return
        self._closed = True
        while self.spares:
            self.spares.popleft().close()
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


def _kill_launched(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(fut.result(), signal.SIGKILL)
