"""A supervisor: a subreaper that outlives nothing it started, even when its worker dies hard.

Two processes are supervised this way (S below): the worker's *keeper* around each of its
zygotes (the warm path), and, on the cold path, a job's own command. S starts its one child
("J": the zygote, or the job) and waits:

- S is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): whatever J's tree orphans, even a
  process that double-forks and ``setsid``\\ s away from its process group, is re-parented to S
  (or to a subreaper below it: the zygote is one) instead of to init, so S can always find it;
- when J exits, S SIGKILLs every descendant left, reaps them, and exits with J's status (killed
  by a signal: S kills itself with the same signal), so the executor reads J's exit as before;
- S dies with its parent (``PR_SET_PDEATHSIG`` = ``SIGUSR1``, a signal it catches): when the
  worker is killed with ``kill -9``, S kills every descendant, then itself. The cleanup does not
  depend on the worker surviving;
- S ignores SIGINT, SIGTERM and SIGHUP: the executor stops a cold job by signalling its process
  group, which reaches J and its group; S waits for J to go, then cleans up. ``SIGUSR1`` sent by
  the executor means "stop everything now" (the end of the kill grace).

**The warm path** (issue 35: one fork per job): the zygote forks each job itself and supervises
it (``zygote.py``, ``orphans.py``); this module only gives the zygote its keeper, forked once
when the zygote starts (:func:`fork_supervised`: the zygote's own process stays behind as S, its
child goes on as the zygote). A job costs no supervisor of its own; what S adds is the case no
job-level code can cover: the zygote itself killed hard, its jobs' leftovers then re-parented to
S and killed. **The cold path** runs this file as a script (``python -I -S reaper.py PARENT_PID --
ARGV...``: about 30 ms of interpreter start-up) around a command started with ``posix_spawn``
(no copy of S), used only when the warm runner is off or unavailable.
Standard library only, and nothing imported at module level beyond it: the script form runs
without ``site`` and without this package on its path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from typing import NoReturn

STOP = signal.SIGUSR1
"""Sent to S (by the kernel when its parent dies, or by the executor): kill everything, exit."""

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Signals Python changes at start-up that an exec'd job must see at their defaults (as
# subprocess's restore_signals does), plus the ones S ignores.
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ, *IGNORED)
ROUNDS = 200  # kill-and-reap rounds before giving up on a descendant that will not die


def prctl(option: int, arg: int) -> None:
    """``prctl(option, arg)`` for this process (raises OSError when the kernel refuses)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _become_supervisor(parent: int) -> None:
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, STOP)
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STOP, _stop)
    if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
        _stop(STOP, None)


def spawn_supervised(parent: int, argv: list[str], env: dict[str, str]) -> NoReturn:
    """Become S and start ``argv`` as J with ``posix_spawn`` (no copy of this process: the
    cheap way for a command); J's signals at their defaults. Never returns."""
    _become_supervisor(parent)
    try:
        pid = os.posix_spawnp(argv[0], argv, env, setsigdef=(*RESTORED, STOP), setsigmask=())
    except OSError as exc:
        code = 126 if isinstance(exc, PermissionError) else 127
        with contextlib.suppress(OSError):
            os.write(2, f"gpulayer: cannot run {argv[0]}: {exc.strerror}\n".encode())
        os._exit(code)
    _supervise(pid)


def fork_supervised(parent: int) -> int:
    """Fork a child under a supervisor; returns in the child only (with 0).

    The calling process becomes S: it never returns from here. ``parent`` is the process whose
    death stops S (passed in: by now ``getppid()`` may already be init if that parent died).
    The child gets SIGKILL when S dies, whatever kills S, and starts with the signals S changed
    at their defaults. The zygote calls it once at its start: S is then its keeper.
    """
    _become_supervisor(parent)
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        for sig in (*IGNORED, STOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with S, whatever kills S
        if os.getppid() != supervisor:  # S died before prctl
            os._exit(1)
        return 0
    _supervise(pid)


def _supervise(job: int) -> NoReturn:
    """S's life: hold no stdio (the job's pipes end with the job), wait for J, clean up, exit."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # J is gone and reaped (cannot happen before J's own report)
            os._exit(0)
        if pid == job:
            break
    kill_descendants()
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # mirror a death by signal, so the executor reads J's own
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
            signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
            os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


def _stop(_sig: int, _frame: object) -> None:
    """Parent gone, or the executor says stop: kill every descendant, then die as killed."""
    kill_descendants()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_descendants() -> None:
    """SIGKILL every process below this one and reap them, until none is left.

    A killed process's orphans are re-parented to us (we are a subreaper), so each round finds
    the next generation; the rounds end when we have no child at all.
    """
    if not _has_children():  # the common case: the job left nothing behind (no /proc reads)
        return
    me = os.getpid()
    for _ in range(ROUNDS):
        _has_children()
        alive = [p for p in _descendants(me) if not _is_zombie(p)]
        if not alive and not _has_children():
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def _has_children() -> bool:
    """True while any child (running or not yet reaped) is left; reaps the exited ones."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _descendants(root: int) -> list[int]:
    """Processes below ``root``: through /proc/PID/task/TID/children, else a full /proc scan."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _children(pid)
        if kids is None:
            return _descendants_by_scan(root)
        found.extend(kids)
        todo.extend(kids)
    return found


def children_of(pid: int) -> list[int]:
    """The children of ``pid`` (live or zombie), read from /proc."""
    kids = _children(pid)
    if kids is None:
        return [p for p in _descendants_by_scan(pid) if _parent(p) == pid]
    return kids


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int) -> list[int] | None:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids  # gone meanwhile
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(p) for p in f.read().split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):
                return None  # no CONFIG_PROC_CHILDREN: scan instead
        except (OSError, ValueError):
            continue
    return kids


def _descendants_by_scan(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        kids = parents.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone


def main(argv: list[str]) -> NoReturn:
    """``python -S reaper.py PARENT_PID -- ARGV...``: S, and ARGV as J (127/126 if it can't)."""
    parent, sep, *command = argv
    if sep != "--" or not command:
        print("usage: reaper.py PARENT_PID -- ARGV...", file=sys.stderr)
        os._exit(2)
    spawn_supervised(int(parent), command, _start_env())


def _start_env() -> dict[str, str]:
    """The environment this process was started with, exactly.

    ``os.environ`` may differ: the interpreter sets ``LC_CTYPE`` in a C locale (PEP 538) before
    any code runs. ``/proc/self/environ`` is the block ``exec`` received.
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


if __name__ == "__main__":
    main(sys.argv[1:])
