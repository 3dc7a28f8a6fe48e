"""A job's processes as the operating system sees them: spawning, waiting, stopping, leftovers.

Every job's main process (the one the executor sees: its pid, its process group, its exit
status) leads a session and process group of its own, so stopping the group stops the job. On
the warm path it is the job's own process, forked by the zygote, which supervises it: it reaps
it, kills its group when it ends and whatever left the group (``zygote.py``, ``orphans.py``). On
the cold path it is a supervisor (:mod:`.reaper`, a subreaper) around the job. Either way what a
job started dies with it, and with its worker; :func:`reap_leftovers` is the backstop for what a
worker that died hard left anyway, found by the job id in each process's start-up environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Protocol

from ..job import JOB_ID_ENV
from .reaper import STOP

REAPER = str(Path(__file__).with_name("reaper.py"))


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


async def spawn_cold(
    argv: list[str], cwd: Path, env: dict[str, str], stdin: int | None = None
) -> Spawned:
    """Start ``argv`` under its supervisor, in a session of its own, with piped stdout/stderr.

    The supervisor (:mod:`.reaper`, run by this interpreter without ``site``: ~15 ms) dies with
    this worker and takes everything the job started with it. A program that cannot be run
    ends with 127 (not found) or 126 (not executable), as a shell reports it. ``stdin``: an fd
    for the job's stdin (a session's socket); default /dev/null.
    """
    prefix = [sys.executable, "-I", "-S", REAPER, str(os.getpid()), "--"]
    return await asyncio.create_subprocess_exec(
        *prefix,
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


def missing_program(program: str, path: str, cwd: Path) -> str | None:
    """Why ``program`` cannot be started, or None (checked before spawning: clear reasons)."""
    if "/" in program:
        full = Path(program) if Path(program).is_absolute() else cwd / program
        if not full.exists():
            return f"command not found: {program} (no such file)"
        if not os.access(full, os.X_OK):
            return f"permission denied: {program} is not executable"
        return None
    if shutil.which(program, path=path) is None:
        return f"command not found: {program} (not on the job's PATH)"
    return None


async def main_exited(proc: Spawned) -> None:
    """Wait for the job's main process to exit, even while its children hold the pipes open.

    On Python 3.11 ``Process.wait()`` also waits for stdout/stderr to close, which a leftover
    grandchild can delay forever; a pidfd becomes readable the moment the main process exits.
    A zygote child's ``wait()`` ends with the zygote's exit message, which carries the status
    (a pidfd would fire before it arrives), and never waits for pipes.
    """
    if not isinstance(proc, asyncio.subprocess.Process):
        await proc.wait()
        return
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        await proc.wait()
        return
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def stop_now(proc: Spawned) -> None:
    """Kill a job at once, everything it started with it (the end of a kill grace): a warm job's
    group (its zygote kills what left it), a cold job's supervisor (it kills all below it)."""
    stop = getattr(proc, "stop_now", None)
    if stop is not None:
        stop()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, STOP)


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while any process of the group lives."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reap_leftovers(work_root: Path) -> list[int]:
    """Stop processes of jobs whose worker died hard, and remove their directories.

    Called when a worker starts, before it runs anything: every job directory still present
    belongs to a previous incarnation. Only processes in the recorded process group whose
    environment names that job are killed, so a recycled pid is never hit.
    """
    killed: list[int] = []
    jobs_dir = work_root / "jobs"
    if not jobs_dir.is_dir():
        return killed
    for job_dir in jobs_dir.iterdir():
        job_id = job_dir.name.split("-")[0]
        with contextlib.suppress(OSError, ValueError):
            pgid = int((job_dir / "pgid").read_text())
            marker = f"{JOB_ID_ENV}={job_id}".encode()
            for proc_dir in Path("/proc").iterdir():
                if not proc_dir.name.isdigit():
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = (proc_dir / "stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                        continue
                    if marker not in (proc_dir / "environ").read_bytes().split(b"\0"):
                        continue
                    os.kill(int(proc_dir.name), signal.SIGKILL)
                    killed.append(int(proc_dir.name))
        shutil.rmtree(job_dir, ignore_errors=True)
    return killed
