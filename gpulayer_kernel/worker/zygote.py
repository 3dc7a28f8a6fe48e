"""A warm runner ("zygote"): forks single-process Python jobs from an interpreter already started.

A cold Python job pays interpreter start-up plus ``import gpulayer_kernel.runner`` (~100 ms on a
loaded 2-core box) before the user's first line runs. The zygote is a long-lived helper
(``python -m gpulayer_kernel.worker.zygote``), one per worker (per :class:`ExecutorConfig`), started
lazily by the first Python job and again after it dies. It has imported the runner and the in-job
API; to launch a job the worker sends it one message on a UNIX ``SOCK_SEQPACKET`` socket: JSON
``{"id", "entrypoint", "cwd", "env"}`` plus the job's stdin/stdout/stderr as SCM_RIGHTS fds. The
zygote ``fork()``s; the child becomes the job exactly as a cold spawn would have made it:

- its own session and process group (``setsid``; pgid == pid, so ``killpg`` stops it and its
  children), and ``PR_SET_PDEATHSIG=SIGKILL`` (the zygote has it too, towards the worker: a worker
  that dies hard takes the zygote and its running jobs with it);
- stdio on the worker's pipes, ``cwd``, ``os.environ`` *exactly* the job's environment (the zygote
  itself starts from the allow-listed one, never the worker's secrets), ``sys.path`` and
  ``sys.argv`` as ``python -m gpulayer_kernel.runner ENTRYPOINT`` would have them, std streams
  rebuilt (``PYTHONUNBUFFERED`` honoured), signal handlers back to Python's defaults, RNGs
  re-seeded (``random`` reseeds itself after fork; numpy's global RNG does not: reseeded if loaded);
- ``/proc/<pid>/environ`` (the start-up environment block, which ``fork`` copies and ``setenv``
  never changes) names the job: the zygote starts with a placeholder ``GPULAYER_JOB_ID`` that the
  child overwrites in place, so ``reap_leftovers`` recognises its processes after a worker crash;
- it then runs ``runner.main([entrypoint])`` and exits as a normal shutdown would (non-daemon
  threads joined, ``atexit`` handlers run, garbage collected, streams flushed) but without module
  teardown, which costs a forked child more than everything else it does (:func:`_exit_job`).

The zygote replies ``{"id", "pid"}``, reaps its children (SIGCHLD through a wakeup fd) and sends
``{"exit": pid, "code": N}`` (``-signal`` when killed, like ``Process.returncode``).
The worker cannot ``waitpid`` a process it did not fork: that message *is* the job's exit status.
If the zygote dies, its children die with it (pdeathsig) and every pending exit reads as SIGKILL.

``GPULAYER_ZYGOTE_PRELOAD=torch,numpy`` (worker environment) imports those modules in the zygote
too, so jobs skip their import (~2 s for torch). Importing torch does not initialise CUDA and the
zygote never calls anything that would (no ``torch.cuda.*``, no tensors on a device): a CUDA
context does not survive ``fork``, and ``CUDA_VISIBLE_DEVICES`` is only read when a child first
initialises CUDA — after it has its own environment. Do not preload modules that start threads at
import: the zygote must stay single-threaded to fork safely.

Not taken by the warm path (they use the cold spawn, unchanged): command workloads, gangs and
multi-node jobs (torchrun), jobs whose environment sets interpreter start-up variables
(``PYTHONHASHSEED``, ``PYTHONOPTIMIZE``, …: see :data:`STARTUP_VARS`). A zygote that cannot start
or answer falls back to the cold spawn (warned once): the optimisation never fails a job.
Known difference: jobs forked from one zygote share its hash seed (``PYTHONHASHSEED`` randomisation
is per zygote, not per job).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import json
import logging
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from .. import job, runner
from .env import base_env

if TYPE_CHECKING:
    from .executor import ExecutorConfig

log = logging.getLogger("gpulayer.worker")

PRELOAD_ENV = "GPULAYER_ZYGOTE_PRELOAD"
"""Worker setting: comma-separated modules the zygote imports up front (e.g. ``torch``)."""

# Interpreter start-up settings a forked child cannot honour: such jobs take the cold spawn.
STARTUP_VARS = frozenset(
    {
        "PYTHONHASHSEED",
        "PYTHONOPTIMIZE",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONWARNINGS",
        "PYTHONDEVMODE",
        "PYTHONSAFEPATH",
        "PYTHONFAULTHANDLER",
        "PYTHONTRACEMALLOC",
        "PYTHONMALLOC",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONNOUSERSITE",
        "PYTHONUSERBASE",
        "PYTHONHOME",
        "PYTHONPYCACHEPREFIX",
        "PYTHONINSPECT",
        "PYTHONVERBOSE",
        "PYTHONDEBUG",
        "PYTHONSTARTUP",
        "PYTHONCOERCECLOCALE",
        "PYTHONINTMAXSTRDIGITS",
        "PYTHONPLATLIBDIR",
        "PYTHONBREAKPOINT",
        "PYTHONPROFILEIMPORTTIME",
        "PYTHONX",
    }
)
START_TIMEOUT = 30.0  # seconds for the zygote to import what it preloads and say "ready"
SPAWN_TIMEOUT = 10.0  # seconds for the zygote to answer a launch with a pid
_MAX_MSG = 1 << 20  # one SEQPACKET message: a launch request (the env dominates) or a reply
_SLOT_LEN = 128  # bytes reserved in the zygote's environment block for a child's job id
_PR_SET_PDEATHSIG = 1
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


# -- the zygote process --------------------------------------------------------------------------


def _pdeathsig(parent: int) -> None:
    """Get SIGKILL when ``parent`` exits; exit now if it already has (the race before prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _env_slot() -> int | None:
    """Address of the placeholder ``GPULAYER_JOB_ID`` value in this process's environment block."""
    if len(os.environ.get(job.JOB_ID_ENV, "")) != _SLOT_LEN:
        return None
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_void_p
    addr: int | None = libc.getenv(job.JOB_ID_ENV.encode())
    return addr


def serve(sock: socket.socket, preload: list[str]) -> str | None:
    """The zygote's loop. Returns None when the worker hangs up; in a forked child, its entrypoint.

    Single-threaded on purpose: ``fork`` copies only the calling thread, so a lock held by another
    thread would stay locked in the child forever.
    """
    for name in preload:
        importlib.import_module(name)
    # Children's garbage collections skip what the zygote holds: fewer copy-on-write faults.
    gc.freeze()
    slot = _env_slot()
    zygote = os.getpid()
    base_path = [p for p in sys.path[1:] if p != _PACKAGE_ROOT]  # [0] is the zygote's cwd
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through wfd
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(rfd, selectors.EVENT_READ)
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        for key, _ in sel.select():
            if key.fd == rfd:
                with contextlib.suppress(BlockingIOError):
                    os.read(rfd, 4096)
                _reap(sock)
                continue
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 3)
            if not msg:  # the worker closed its end: nothing more to do
                for fd in fds:
                    os.close(fd)
                return None
            req: dict[str, Any] = {}
            try:
                req = json.loads(msg)
                if len(fds) != 3:
                    raise ValueError(f"expected 3 fds, got {len(fds)}")
                pid = os.fork()
            except Exception as exc:  # noqa: BLE001 - tell the worker; it falls back
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"id": req.get("id"), "error": repr(exc)}).encode())
                continue
            if pid == 0:
                try:
                    sel.close()
                    sock.close()
                    for fd in (rfd, wfd):
                        os.close(fd)
                    _become_job(req, fds, slot, base_path, zygote)
                except BaseException as exc:  # noqa: BLE001 - never return into the zygote loop
                    with contextlib.suppress(Exception):
                        os.write(
                            2, f"gpulayer: the warm runner could not start: {exc!r}\n".encode()
                        )
                    os._exit(126)
                entry: str = req["entrypoint"]
                return entry
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        sock.send(json.dumps({"exit": pid, "code": code}).encode())


def _become_job(
    req: dict[str, Any], fds: list[int], slot: int | None, base_path: list[str], zygote: int
) -> None:
    """In the forked child: turn this copy of the zygote into the job's process."""
    os.setsid()  # own session and process group, as the cold spawn's start_new_session=True
    _pdeathsig(zygote)  # passed in: getppid() here may already be init, if the zygote died
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)  # dup2 clears close-on-exec: the job's own subprocesses inherit them
    for fd in fds:
        if fd > 2:
            os.close(fd)
    env: dict[str, str] = req["env"]
    job_id = env.get(job.JOB_ID_ENV, "").encode()
    if slot is not None and 0 < len(job_id) < _SLOT_LEN:
        ctypes.memmove(slot, job_id.ljust(_SLOT_LEN, b"\0"), _SLOT_LEN)
    cwd: str = req["cwd"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # As `python -m`: the cwd, then $PYTHONPATH, then the interpreter's own paths.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd, *extra, *(p for p in base_path if p not in extra)]
    sys.argv = [str(runner.__file__), req["entrypoint"]]
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = _std_stream(0, sys.stdin, unbuffered, False)
    sys.stdout = _std_stream(1, sys.stdout, unbuffered, False)
    sys.stderr = _std_stream(2, sys.stderr, unbuffered, True)
    # The originals, as a fresh interpreter has them (mypy: these names are Final in typeshed).
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, f"__{name}__", getattr(sys, name))
    random.seed()  # random already reseeds after fork; explicit, as numpy's does not
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _std_stream(fd: int, like: Any, unbuffered: bool, line_buffering: bool) -> io.TextIOWrapper:
    """A fresh std stream on ``fd``, buffered as the interpreter's start-up would make it."""
    writing = fd != 0
    binary: Any = open(  # noqa: SIM115 - lives as long as the process
        fd, "wb" if writing else "rb", buffering=0 if unbuffered and writing else -1, closefd=False
    )
    encoding = getattr(like, "encoding", None) or "utf-8"
    errors = getattr(like, "errors", None) or ("backslashreplace" if fd == 2 else "strict")
    return io.TextIOWrapper(
        binary,
        encoding=encoding,
        errors=errors,
        line_buffering=line_buffering and not unbuffered,
        write_through=unbuffered,
    )


def main(argv: list[str]) -> int:
    """``python -m gpulayer_kernel.worker.zygote FD PARENT_PID [PRELOAD,...]``."""
    fd, parent = int(argv[0]), int(argv[1])
    _pdeathsig(parent)
    # The worker may live in a Jupyter kernel, whose interrupt signals its process group; we run
    # in a session of our own, and ignore SIGINT besides (children restore the default).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload = [m for m in (argv[2] if len(argv) > 2 else "").split(",") if m.strip()]
    sock = socket.socket(fileno=fd)
    try:
        entry = serve(sock, [m.strip() for m in preload])
    except Exception as exc:  # noqa: BLE001 - tell the worker why, then stop
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"fatal": repr(exc)}).encode())
        return 1
    if entry is None:
        return 0
    _exit_job(runner.main([entry]))  # in the job's process: the cold path's `python -m` body


def _exit_job(code: int) -> NoReturn:
    """End the job's process as interpreter shutdown would, minus tearing down every module.

    That teardown costs a forked child ~14 ms (each object it touches is a copy-on-write page
    fault) and does nothing a job can see beyond these steps: join non-daemon threads, run
    ``atexit`` handlers, collect garbage (unclosed files flush), flush the std streams.
    """
    try:
        getattr(threading, "_shutdown", lambda: None)()
        atexit._run_exitfuncs()
        gc.collect()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


# -- the worker's side ---------------------------------------------------------------------------


class Spawned(Protocol):
    """What the executor needs of a job's main process: both cold and warm spawns have it."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    @property
    def stderr(self) -> asyncio.StreamReader | None: ...

    async def wait(self) -> int: ...


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

    def __init__(self, python: str, preload: tuple[str, ...], env: dict[str, str]) -> None:
        self.python = python
        self.preload = preload
        self._env = env
        self.loop = asyncio.get_running_loop()
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.zygote_pid: int | None = None
        self._ready: asyncio.Future[int] = self.loop.create_future()
        self._launches: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._next_id = 0
        self.dead = False

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self._env)
        env["PYTHONPATH"] = _PACKAGE_ROOT
        env[job.JOB_ID_ENV] = "-" * _SLOT_LEN  # the slot each child overwrites with its job id
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
            self.zygote_pid = await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT)
        except (TimeoutError, ZygoteUnavailable) as exc:
            self.close()
            raise ZygoteUnavailable(f"the warm runner did not start: {exc or 'timed out'}") from exc

    def _readable(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(_MAX_MSG)
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
        if not self._ready.done():
            self._ready.set_exception(ZygoteUnavailable("it exited during start-up"))
            self._ready.exception()  # retrieved: start() reports it, if anyone still waits
        for fut in self._launches.values():
            if not fut.done():
                fut.set_exception(ZygoteUnavailable("it exited"))
        for fut in self._exits.values():
            if not fut.done():
                fut.set_result(-signal.SIGKILL)
        if not was_dead and self.zygote_pid is not None:
            log.warning(
                "the warm runner (pid %s) exited; its running jobs died with it", self.zygote_pid
            )
        self._reap_zygote(wait=0.0)

    def _reap_zygote(self, wait: float) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(wait)
            return
        if self.proc.returncode is None and wait == 0.0:
            return  # still exiting: close() or the next check collects it
        self.proc.kill()
        self.proc.wait()

    async def spawn(self, entrypoint: str, cwd: Path, env: dict[str, str]) -> ZygoteChild:
        """Fork one job: its stdout/stderr come back as StreamReaders, as with a cold spawn."""
        if self.dead or self.sock is None:
            raise ZygoteUnavailable("not running")
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[int] = self.loop.create_future()
        self._launches[rid] = fut
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        request = {"id": rid, "entrypoint": entrypoint, "cwd": str(cwd), "env": env}
        try:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [null, out_w, err_w])
            except OSError as exc:  # full buffer, or the zygote is gone
                raise ZygoteUnavailable(f"launch request failed: {exc}") from exc
            finally:
                for fd in (null, out_w, err_w):
                    os.close(fd)
            pid = await asyncio.wait_for(asyncio.shield(fut), SPAWN_TIMEOUT)
        except BaseException as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            if isinstance(exc, asyncio.TimeoutError):
                self.close()  # if it forked after all, the job dies with it (pdeathsig)
                raise ZygoteUnavailable("no answer to a launch request") from None
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
                open(fd, "rb", buffering=0),  # noqa: SIM115 - the transport closes it
            )
            readers.append(reader)
            transports.append(transport)
        return ZygoteChild(pid, self._exit_future(pid), readers[0], readers[1], transports)

    def close(self) -> None:
        """Hang up; the zygote exits on EOF (and takes any still running job with it)."""
        if self.sock is not None and not self.dead:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        self.dead = True
        self._reap_zygote(wait=2.0)


def _kill_launched(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(fut.result(), signal.SIGKILL)


# One zygote per ExecutorConfig (i.e. per worker): id(config) → client. ExecutorConfig is a
# mutable dataclass, so unhashable; a finalizer drops the entry when the config goes.
_clients: dict[int, ZygoteClient] = {}
_broken: set[int] = set()
_warned = False


def _warn_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("warm runner unavailable (%s); Python jobs use a fresh interpreter", reason)


def _forget(key: int) -> None:
    client = _clients.pop(key, None)
    _broken.discard(key)
    if client is not None:
        client.close()


async def _client(config: ExecutorConfig, env: dict[str, str]) -> ZygoteClient:
    key = id(config)
    if key in _broken:
        raise ZygoteUnavailable("it failed to start before")
    preload = tuple(m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m.strip())
    client = _clients.get(key)
    if client is not None and (
        client.dead
        or client.loop is not asyncio.get_running_loop()
        or client.python != config.python
        or client.preload != preload
    ):
        client.close()
        client = None
    if client is None:
        if key not in _clients:
            weakref.finalize(config, _forget, key)
        client = _clients[key] = ZygoteClient(config.python, preload, env)
        try:
            await client.start()
        except ZygoteUnavailable:
            _broken.add(key)  # a failed start is likely to fail again: stop trying
            raise
    return client


async def spawn(
    config: ExecutorConfig, entrypoint: str, cwd: Path, env: dict[str, str]
) -> ZygoteChild | None:
    """Launch a Python job through this worker's zygote; None means "use the cold spawn"."""
    if any(k in STARTUP_VARS for k in env):
        return None
    try:
        # The zygote starts from the allow-listed worker environment: no secrets in its memory.
        client = await _client(config, base_env(extra_allowed=config.extra_env_allowed))
        return await client.spawn(entrypoint, cwd, env)
    except ZygoteUnavailable as exc:
        _warn_once(str(exc))
        return None


def shutdown(config: ExecutorConfig) -> None:
    """Stop this worker's zygote now (it also stops when the config is garbage-collected)."""
    _forget(id(config))


def running_pid(config: ExecutorConfig) -> int | None:
    """The pid of this worker's live zygote, if any (for tests and diagnostics)."""
    client = _clients.get(id(config))
    return client.zygote_pid if client is not None and not client.dead else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
