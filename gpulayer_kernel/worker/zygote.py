"""The warm runner's fork server ("zygote"): forks jobs from an interpreter already started.

A cold Python job pays interpreter start-up plus ``import gpulayer_kernel.runner`` (~100 ms on a
loaded 2-core box) before the user's first line runs. The zygote is a long-lived helper
(``python -m gpulayer_kernel.worker.zygote``: this module, which runs in that helper process), one
per worker, owned by its agent's :class:`~gpulayer_kernel.worker.zygote_client.WarmRunner` (the
worker's side), started lazily by the first Python job and again after it dies. It has imported
the runner and the in-job API; to launch a job the worker sends it one message on a UNIX
``SOCK_SEQPACKET`` socket: JSON ``{"id", "entrypoint", "cwd", "env"}`` (or ``"argv"`` instead of
``"entrypoint"``: a command to exec) plus the job's stdin/stdout/stderr as SCM_RIGHTS fds. The
zygote ``fork()``s; the child becomes the job's supervisor (:mod:`.reaper`), which forks the job
exactly as a cold spawn would have made it:

- its own session and process group (``setsid``; pgid == the supervisor's pid, so ``killpg``
  stops the job and its children); the supervisor is a subreaper that dies with the zygote
  (``PR_SET_PDEATHSIG``), killing everything the job started first, even processes that left the
  group; the zygote dies with the worker, so a worker that dies hard takes its jobs with it;
- a command (``argv``) is started there (``posix_spawn``), with exactly the job's environment
  and signals at their defaults; a Python job goes on:
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

Not taken by the warm path (they use the cold spawn: ``python -S reaper.py`` around the argv):
gangs and multi-node jobs (torchrun), Python jobs whose environment sets interpreter start-up
variables (``PYTHONHASHSEED``, ``PYTHONOPTIMIZE``, …: see :data:`STARTUP_VARS`; commands with them
are exec'd and unaffected). A zygote that cannot start or answer falls back to the cold spawn
(warned once): the optimisation never fails a job.
Known difference: jobs forked from one zygote share its hash seed (``PYTHONHASHSEED`` randomisation
is per zygote, not per job).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import json
import os
import random
import selectors
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from .. import job, runner
from . import reaper

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
MAX_MSG = 1 << 20  # one SEQPACKET message: a launch request (the env dominates) or a reply
SLOT_LEN = 128  # bytes reserved in the zygote's environment block for a child's job id
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_PR_SET_PDEATHSIG = 1


def _pdeathsig(parent: int) -> None:
    """Get SIGKILL when ``parent`` exits; exit now if it already has (the race before prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _env_slot() -> int | None:
    """Address of the placeholder ``GPULAYER_JOB_ID`` value in this process's environment block."""
    if len(os.environ.get(job.JOB_ID_ENV, "")) != SLOT_LEN:
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
    base_path = [p for p in sys.path[1:] if p != PACKAGE_ROOT]  # [0] is the zygote's cwd
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
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MSG, 3)
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
            except Exception as exc:
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
                except BaseException as exc:
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
    """In the forked child: become the job's supervisor, and in its child the job's process."""
    os.setsid()  # own session and process group, as the cold spawn's start_new_session=True
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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
    if slot is not None and 0 < len(job_id) < SLOT_LEN:
        ctypes.memmove(slot, job_id.ljust(SLOT_LEN, b"\0"), SLOT_LEN)
    # This process becomes the supervisor (it dies with the zygote, `zygote` passed in: by now
    # getppid() may be init); only a Python job's process returns from here.
    if req.get("argv"):  # a command, not Python: spawned as the cold spawn would, cheaply
        os.chdir(req["cwd"])
        reaper.spawn_supervised(zygote, list(req["argv"]), dict(env))
    reaper.fork_supervised(zygote)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
    binary: Any = open(
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
    except Exception as exc:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
