"""The warm runner's fork server ("zygote"): forks jobs from an interpreter already started.

A cold Python job pays interpreter start-up plus ``import gpulayer_kernel.job.runner`` (~100 ms on a
loaded 2-core box) before the user's first line runs. The zygote is a long-lived helper
(``python -m gpulayer_kernel.worker.zygote``: this module, which runs in that helper process),
owned by its worker's :class:`~gpulayer_kernel.worker.warm.WarmRunner`, started lazily
by the first job and again after it dies. It has imported the runner and the in-job API (and, for
Python jobs that import torch, what ``GPULAYER_ZYGOTE_PRELOAD`` names: torch where installed;
``needs_torch.py`` tells them from their source, the rest fork from a light one). Worker and zygote
speak JSON messages on a UNIX ``SOCK_SEQPACKET`` socket; fds travel as SCM_RIGHTS.

One fork per job (issue 35): the zygote forks each job's process J itself, in a session and process
group of its own (pgid == J's pid, so ``killpg`` stops the job and its children; J's pid is given
out only once that group exists), dying with the zygote (``PR_SET_PDEATHSIG``), and supervises it:
it is J's parent (it reaps J through ``waitid`` on SIGCHLD, kills J's process group when J ends,
and reports the exit) and a child subreaper (``PR_SET_CHILD_SUBREAPER``), so whatever a job leaves,
even a grandchild that ``setsid``\\ s out of the group, is re-parented to it and killed once its
job has ended (``orphans.py``). Above the zygote sits its *keeper* (:func:`reaper.fork_supervised`,
forked once when the zygote starts: the process the worker started stays behind as it): a subreaper
that dies with the worker and kills everything below it when the zygote dies, however hard, or when
the worker does. Two ways to get a J:

- **Spares, forked ahead of time** (``{"spares": n}``): the zygote forks J, and J runs a
  throwaway cell (the pages a cell touches are copied now) and waits on a channel of its own (a
  socketpair whose other end the zygote hands to the worker with ``{"spare": pid}``). To run a
  Python job the worker sends the job straight to an idle J (no fork, no import on the critical
  path: the zygote is not even involved), and J answers ``{"took": pid}`` first. A spare that
  died while idle closes its channel instead: the worker never hands it a job. The worker asks
  for a new spare after each use, so forking a replacement (~7 ms for a torch-loaded zygote, a
  fraction of a millisecond otherwise) happens after the job, off its critical path.
- **On demand** (``{"id", "entrypoint" | "argv", "cwd", "env"}`` plus the job's stdin, stdout and
  stderr): a Python job's J is forked now; a command (``argv``) is started with ``posix_spawn``
  (no copy of the zygote: ``vfork`` and ``exec``, signals at their defaults, its own session),
  from the job's ``cwd``. The zygote replies ``{"id", "pid"}``, or ``{"id", "failed": code,
  "error"}`` when the command cannot be executed (127 not found, 126 not executable).

J then becomes the job (``jobproc.py``: stdio, cwd, environment, ``sys.path``, ``sys.argv``, std
streams, signals and RNGs as a fresh interpreter has them; its id written into its start-up
environment block for ``reap_leftovers`` and the orphans' sweep) and runs ``runner.main``. The
zygote sends ``{"exit": pid, "code": N}`` for every J (``-signal`` when killed, like
``Process.returncode``) once it has killed J's group: the worker cannot ``waitpid`` a process it
did not fork, so that message *is* the job's exit status. If the zygote dies, its children die
with it (pdeathsig, and the keeper) and every pending exit reads as SIGKILL.

Importing torch does not initialise CUDA and the zygote never calls anything that would (no
``torch.cuda.*``, no tensors on a device); it checks after its imports and refuses to serve if a
preloaded module did (a CUDA context does not survive ``fork``, and ``CUDA_VISIBLE_DEVICES`` is
only read when a child first initialises CUDA — after it has its own environment). Do not
preload modules that start threads at import: the zygote must stay single-threaded to fork.

Python jobs whose environment sets interpreter start-up variables (``PYTHONHASHSEED``,
``PYTHONOPTIMIZE``, …: see :data:`STARTUP_VARS`) are not forked: they take the on-demand command
path (a fresh interpreter, exec'd). A zygote that cannot start or answer falls back to the cold
spawn (``python -S reaper.py`` around the argv; warned once): the optimisation never fails a
job. Known difference: jobs forked from one zygote share its hash seed (``PYTHONHASHSEED``
randomisation is per zygote, not per job).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from ..job import runner
from . import jobproc, reaper
from .jobproc import PACKAGE_ROOT, SLOT_LEN
from .orphans import Orphans

__all__ = ["MAX_MSG", "PACKAGE_ROOT", "PRELOAD_ENV", "SLOT_LEN", "STARTUP_VARS", "main"]

PRELOAD_ENV = "GPULAYER_ZYGOTE_PRELOAD"
"""Worker setting: comma-separated modules the Python jobs' zygote imports up front (default:
torch and numpy where installed; empty: none)."""

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
# Signals a command must start with at their defaults (this process ignores SIGINT; Python
# ignores SIGPIPE and SIGXFSZ), as subprocess's restore_signals has them.
COMMAND_SIGDEF = reaper.RESTORED

Request = dict[str, Any]


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    return bool(is_initialized()) if callable(is_initialized) else False


class Zygote:
    """The fork server's loop, its job processes and what they inherit (one per zygote)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid = os.getpid()
        self.slot = jobproc.env_slot()
        self.base_path = [p for p in sys.path[1:] if p != PACKAGE_ROOT]  # [0] is the zygote's cwd
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self.sel = selectors.DefaultSelector()
        self.jobs: set[int] = set()  # job processes alive (spares included): our children
        self.orphans = Orphans(self.pid)

    def serve(self) -> Request | None:
        """The loop. Returns None when the worker hangs up; in a forked job process, its job.

        Single-threaded on purpose: ``fork`` copies only the calling thread, so a lock held by
        another thread would stay locked in the child forever.
        """
        signal.set_wakeup_fd(self.wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through wfd
        self.sel.register(self.sock, selectors.EVENT_READ)
        self.sel.register(self.rfd, selectors.EVENT_READ)
        self.sock.send(json.dumps({"ready": self.pid}).encode())
        while True:
            for key, _ in self.sel.select():
                if key.fd == self.rfd:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.rfd, 4096)
                    self._reap()
                    continue
                msg, fds, _flags, _addr = socket.recv_fds(
                    self.sock, MAX_MSG, 3, socket.MSG_CMSG_CLOEXEC
                )
                if not msg:  # the worker closed its end: nothing more to do
                    for fd in fds:
                        os.close(fd)
                    return None
                job = self._request(msg, fds)
                if job is not None:
                    return job  # in a job's process, with its job

    def _request(self, msg: bytes, fds: list[int]) -> Request | None:
        """Serve one request; returns only in a forked job's process (with its job)."""
        req: Request = {}
        try:
            req = json.loads(msg)
            if "spares" in req:
                for fd in fds:
                    os.close(fd)
                for _ in range(max(0, min(16, int(req["spares"])))):
                    job = self._fork_spare()
                    if job is not None:
                        return job  # in a spare's job process, with its job
                return None
            if len(fds) != 3:
                raise ValueError(f"expected 3 fds, got {len(fds)}")
            if req.get("argv"):
                reply = self._spawn_command(req, fds)
            else:
                pid = self._fork(functools.partial(self._become_job, req, fds))
                if pid == 0:
                    return req
                self.jobs.add(pid)
                reply = {"id": req["id"], "pid": pid}
        except Exception as exc:
            reply = {"id": req.get("id"), "error": repr(exc)}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.sock.send(json.dumps(reply).encode())
        return None

    def _spawn_command(self, req: Request, fds: list[int]) -> dict[str, Any]:
        """Start a command as a job's process: ``posix_spawn`` (``vfork`` + ``exec``: no copy of
        this process), in its own session, its stdio the job's, from its ``cwd``."""
        argv = [str(a) for a in req["argv"]]
        env: dict[str, str] = req["env"]
        os.chdir(req["cwd"])  # single-threaded: nothing else runs until we are back
        try:
            pid = os.posix_spawn(
                _program(argv[0], env.get("PATH", os.defpath)),
                argv,
                env,
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, i) for i, fd in enumerate(fds)],
                setsid=True,
                setsigdef=COMMAND_SIGDEF,
                setsigmask=(),
            )
        except OSError as exc:
            code = 126 if isinstance(exc, PermissionError) else 127
            why = f"cannot run {argv[0]}: {exc.strerror}"
            return {"id": req["id"], "failed": code, "error": why}
        finally:
            os.chdir("/")
        self.jobs.add(pid)
        return {"id": req["id"], "pid": pid}

    def _fork(self, become: Callable[[], None]) -> int:
        """Fork a child that runs ``become`` (the job, or a spare): 0 in the child (once it has),
        its pid in the zygote, returned only once the child leads its own process group.

        The child calls ``setsid`` itself (a parent cannot, and a group leader could not), so
        until it has, ``killpg(pid)`` finds no group (ESRCH): a cancel sent the moment the pid
        is known would be lost. The child says so on a pipe; the zygote waits for that byte (or
        for the pipe's end, if the child died first): microseconds, before the pid goes out."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            self._child(become, w)
            return 0
        os.close(w)
        try:
            os.read(r, 1)
        finally:
            os.close(r)
        return pid

    def _child(self, become: Callable[[], None], ready: int) -> None:
        """In a forked child: drop the zygote's loop, lead a session of its own (then say so on
        ``ready``), then ``become`` (the job, or a spare)."""
        try:
            self.sel.close()
            self.sock.close()
            for fd in (self.rfd, self.wfd):
                os.close(fd)
            os.setsid()  # own session and process group, as the cold spawn's start_new_session
            os.write(ready, b"1")
            os.close(ready)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            reaper.prctl(reaper.PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the zygote
            if os.getppid() != self.pid:  # the zygote died before prctl
                os._exit(1)
            become()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                os.write(2, f"gpulayer: the warm runner could not start: {exc!r}\n".encode())
            os._exit(126)

    def _reap(self) -> None:
        """Collect every child that ended: a job's process (its group is killed, its exit
        reported) or an orphan; then sweep the orphans whose jobs have ended."""
        exits: list[dict[str, int]] = []
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None:
                break
            pid = info.si_pid
            if pid in self.jobs:
                # Not reaped yet: the group's id is still the job's, so this reaches only what
                # the job left in its group (SIGKILL, as the cold path's supervisor does).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            if pid in self.jobs:
                self.jobs.discard(pid)
                exits.append({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
            self.orphans.forget(pid)
        self.orphans.sweep(self.jobs)
        for msg in exits:
            self.sock.send(json.dumps(msg).encode())

    def _become_job(self, req: Request, fds: list[int]) -> None:
        """An on-demand Python job, in its own forked process."""
        jobproc.take_stdio(fds)
        jobproc.name_job(self.slot, req["env"])
        jobproc.become_python_job(req, self.base_path)

    def _fork_spare(self) -> Request | None:
        """Fork a job's process ahead of time; it waits for a job on a channel the worker gets.

        Returns None in the zygote; in the spare, once a job arrived, that job (set up for it).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        job: list[Request] = []

        def become() -> None:
            ours.close()
            _warm_up()
            job.append(self._await_job(theirs))

        pid = self._fork(become)
        if pid == 0:
            return job[0]
        self.jobs.add(pid)
        theirs.close()
        try:
            socket.send_fds(self.sock, [json.dumps({"spare": pid}).encode()], [ours.fileno()])
        finally:
            ours.close()
        return None

    def _await_job(self, chan: socket.socket) -> Request:
        """In a spare: wait for a job; set up for it. EOF (retired, or the worker is gone):
        exit quietly."""
        msg, fds, _flags, _addr = socket.recv_fds(chan, MAX_MSG, 3, socket.MSG_CMSG_CLOEXEC)
        if not msg or len(fds) != 3:
            os._exit(0)
        req: Request = json.loads(msg)
        chan.send(json.dumps({"took": os.getpid()}).encode())
        chan.close()
        jobproc.take_stdio(fds)
        jobproc.name_job(self.slot, req["env"])
        jobproc.become_python_job(req, self.base_path)
        return req


def _program(name: str, path: str) -> str:
    """``name`` looked up on the *job's* ``PATH`` (``posix_spawnp`` would search ours), as a
    shell would; a name with a slash is a path (relative to the job's cwd)."""
    if "/" in name:
        return name
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return name  # not found: posix_spawn says so (ENOENT), reported as 127


def _warm_up() -> None:
    """Run a throwaway cell in a spare before it waits: the pages a cell touches are copied
    (copy-on-write) now, not on its job's critical path (~0.3 ms of a trivial cell)."""
    saved = {k: os.environ.pop(k) for k in ("GPULAYER_RESULT", "GPULAYER_ARGS") if k in os.environ}
    with contextlib.suppress(Exception):
        runner.main(["cell:warm-up.py"], sources={"warm-up.py": "None\n"})
    os.environ.update(saved)


def main(argv: list[str]) -> int:
    """``python -m gpulayer_kernel.worker.zygote FD PARENT_PID [PRELOAD,...]``."""
    fd, parent = int(argv[0]), int(argv[1])
    os.set_inheritable(fd, False)  # passed to us; not to the commands we exec
    # This process stays behind as the zygote's keeper (dies with the worker, kills everything
    # below it when the zygote or the worker dies); the zygote goes on in its child.
    reaper.fork_supervised(parent)
    reaper.prctl(reaper.PR_SET_CHILD_SUBREAPER, 1)  # what our jobs orphan comes to us
    # The worker may live in a Jupyter kernel, whose interrupt signals its process group; we run
    # in a session of our own, and ignore SIGINT besides (children restore the default).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload = [m.strip() for m in (argv[2] if len(argv) > 2 else "").split(",") if m.strip()]
    sock = socket.socket(fileno=fd)
    try:
        for name in preload:
            importlib.import_module(name)
        if _cuda_initialised():
            raise RuntimeError(
                f"preloading {', '.join(preload)} initialised CUDA, which does not survive fork"
            )
        # Children's garbage collections skip what the zygote holds: fewer copy-on-write faults.
        gc.freeze()
        req = Zygote(sock).serve()
    except Exception as exc:
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"fatal": repr(exc)}).encode())
        return 1
    if req is None:
        return 0
    jobproc.run_job(req)  # in the job's process: the cold path's `python -m` body


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
