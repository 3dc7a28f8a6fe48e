"""Becoming a job: what a process forked by the warm runner does before the job's first line.

The zygote (``zygote.py``) forks a job's supervisor and its job process either on demand or ahead
of time (a *spare*: forked before any job exists, waiting for one). Either way the job process
ends up here once it knows its job, and leaves exactly as ``python -m gpulayer_kernel.job.runner
ENTRYPOINT`` started from a fresh interpreter would have it:

- stdio on the worker's pipes, ``cwd``, ``os.environ`` *exactly* the job's environment (the zygote
  itself starts from the allow-listed one, never the worker's secrets), ``sys.path`` and
  ``sys.argv`` as ``python -m`` would have them, std streams rebuilt (``PYTHONUNBUFFERED``
  honoured), signal handlers back to Python's defaults, RNGs re-seeded (``random`` reseeds
  itself after fork; numpy's global RNG does not: reseeded if loaded);
- ``/proc/<pid>/environ`` (the start-up environment block, which ``fork`` copies and ``setenv``
  never changes) names the job: the zygote starts with a placeholder ``GPULAYER_JOB_ID`` that the
  job process overwrites in place, so ``reap_leftovers`` recognises its processes after a crash.

It then runs ``runner.main`` and exits as a normal shutdown would (non-daemon threads joined,
``atexit`` handlers run, garbage collected, streams flushed) but without module teardown, which
costs a forked child more than everything else it does (:func:`exit_job`).

Standard library and this package's light modules only: it runs inside the zygote's children.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import io
import os
import random
import signal
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, NoReturn

from .. import job
from ..job import runner

SLOT_LEN = 128  # bytes reserved in the zygote's environment block for a child's job id
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def env_slot() -> int | None:
    """Address of the placeholder ``GPULAYER_JOB_ID`` value in this process's environment block."""
    if len(os.environ.get(job.JOB_ID_ENV, "")) != SLOT_LEN:
        return None
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_void_p
    addr: int | None = libc.getenv(job.JOB_ID_ENV.encode())
    return addr


def take_stdio(fds: list[int]) -> None:
    """The job's stdin, stdout and stderr as fds 0, 1 and 2 (inherited by its subprocesses)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)  # dup2 clears close-on-exec: the job's own subprocesses inherit them
    for fd in fds:
        if fd > 2:
            os.close(fd)


def name_job(slot: int | None, env: dict[str, str]) -> None:
    """Write the job's id into this process's start-up environment block (``/proc/PID/environ``)."""
    job_id = env.get(job.JOB_ID_ENV, "").encode()
    if slot is not None and 0 < len(job_id) < SLOT_LEN:
        ctypes.memmove(slot, job_id.ljust(SLOT_LEN, b"\0"), SLOT_LEN)


_OWN_FROM = [0]  # the number of the job's first finalizer (become_python_job)


def become_python_job(req: dict[str, Any], base_path: list[str]) -> None:
    """In the job's process (stdio taken, job named): everything else a fresh interpreter has."""
    env: dict[str, str] = req["env"]
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
    # numpy's global RNG, where the zygote made it (``numpy.random`` is not imported with numpy
    # or torch: importing it here would cost a torch-loaded child ~12 ms, and a job importing it
    # later seeds it from the OS anyway).
    npr = sys.modules.get("numpy.random")
    if npr is not None:
        npr.seed()
    # The finalizers that came with the fork belong to the zygote's preloaded modules, not to
    # the job: their teardown is module teardown (torch deregisters its 134 operator libraries
    # one by one: ~30 ms of copy-on-write faults), which ``exit_job`` skips. Each finalizer is
    # numbered as it is made: the job's own are those numbered from here on.
    _OWN_FROM[0] = next(weakref.finalize._index_iter)  # type: ignore[attr-defined]


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


def run_job(req: dict[str, Any]) -> NoReturn:
    """The job's body: the cold path's ``python -m runner ENTRYPOINT`` (a cell may come in
    ``req["sources"]``, held in memory instead of a file), then a fast exit."""
    sources: dict[str, str] | None = req.get("sources")
    exit_job(runner.main([req["entrypoint"]], sources=sources))


def _keep_own_finalizers() -> None:
    """Leave in ``weakref.finalize``'s registry only the finalizers the job made, for its
    ``atexit`` run. The registry keeps them in the order made, so they are read newest first
    until the first inherited one: the inherited ones are not touched at all (detaching each
    cost a torch-loaded child ~1.5 ms of copy-on-write faults)."""
    registry = weakref.finalize._registry  # type: ignore[attr-defined]
    own = []
    for made, info in reversed(registry.items()):
        if info.index < _OWN_FROM[0]:
            break
        own.append((made, info))
    weakref.finalize._registry = dict(reversed(own))  # type: ignore[attr-defined]


def exit_job(code: int) -> NoReturn:
    """End the job's process as interpreter shutdown would, minus tearing down every module.

    That teardown costs a forked child ~14 ms (each object it touches is a copy-on-write page
    fault) and does nothing a job can see beyond these steps: join non-daemon threads, run
    ``atexit`` handlers and the job's own ``weakref.finalize`` callbacks (not those inherited
    from the zygote), collect garbage (unclosed files flush), flush the std streams.
    """
    try:
        getattr(threading, "_shutdown", lambda: None)()
        _keep_own_finalizers()
        atexit._run_exitfuncs()
        gc.collect()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)
