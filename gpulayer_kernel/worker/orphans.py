"""What a job leaves behind: the zygote's sweep of the processes it adopts as their subreaper.

The zygote forks each job's process itself (one fork per job, issue 35) and is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): a process whose parent dies while it lives, anywhere below the
zygote, is re-parented to the zygote instead of to init. That includes what a job left when it
ended (its children are orphaned by its exit) and a grandchild that double-forked and
``setsid``\\ s away from the job's process group while the job still runs. When a job's process
ends the zygote kills its process group (the job's own, led by it); :class:`Orphans` finds the
rest among the zygote's children and kills each one once no job that may own it still runs.

Which job owns an orphan is read from the start-up environment block (``/proc/PID/environ``, as
``reap_leftovers`` reads it): a job's process and everything it forks or execs with its
environment carry ``GPULAYER_JOB_ID=<its id>``. The candidates are fixed when an orphan is first
seen:

- marked with an id: the running jobs with that id (or whose own id cannot be read);
- unmarked (it exec'd with an environment of its own making, without the id): every running job.

It is killed (SIGKILL; its own orphans come back to the zygote and are swept in turn) once none
of its candidates runs. So an orphan is never killed while the job it belongs to still runs, and
always once it has ended; an unmarked one that left its job's group only when every job that ran
beside it has ended. An idle spare (its slot still the placeholder) owns nothing.

Standard library and this package's light modules only: it runs in the zygote.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Collection

from ..job import JOB_ID_ENV
from .reaper import children_of

_MARK = JOB_ID_ENV.encode() + b"="
IDLE = "-"  # the zygote's placeholder job id (dashes): a spare with no job yet
UNKNOWN = None  # a job process whose id cannot be read


def job_of(pid: int) -> str | None:
    """The job id in ``pid``'s start-up environment: the id, ``IDLE`` for a spare's placeholder,
    ``""`` for a live process without one (or whose environment we may not read), None when it
    is gone or a zombie (its memory is gone: it is about to be reaped)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            block = f.read()
    except PermissionError:
        return ""  # it exec'd something privileged: unmarked, as far as we can tell
    except OSError:
        return UNKNOWN
    if not block and _ended(pid):
        return UNKNOWN
    for item in block.split(b"\0"):
        if item.startswith(_MARK):
            value = item[len(_MARK) :]
            return IDLE if value and not value.strip(b"-") else os.fsdecode(value)
    return ""


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


class Orphans:
    """The zygote's adopted children, each with the job processes that may own it."""

    def __init__(self, me: int) -> None:
        self.me = me
        self.suspects: dict[int, frozenset[int]] = {}
        self.killed: set[int] = set()

    def forget(self, pid: int) -> None:
        """``pid`` was reaped: nothing more to do about it."""
        self.suspects.pop(pid, None)
        self.killed.discard(pid)

    def sweep(self, jobs: Collection[int]) -> list[int]:
        """Kill the orphans none of whose candidate jobs is in ``jobs`` (the job processes
        running now); returns the pids killed."""
        live = set(jobs)
        killed: list[int] = []
        ids: dict[int, str | None] = {}
        for pid in children_of(self.me):
            if pid in live or pid in self.killed:
                continue
            owners = self.suspects.get(pid)
            if owners is None:
                mark = job_of(pid)
                if mark is UNKNOWN:
                    continue  # exiting (a zombie soon: reaped, forgotten), or not ours to judge
                owners = self.suspects[pid] = self._candidates(mark, live, ids)
            if owners & live:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            self.killed.add(pid)
            self.suspects.pop(pid, None)
            killed.append(pid)
        return killed

    def _candidates(self, mark: str, live: set[int], ids: dict[int, str | None]) -> frozenset[int]:
        found: set[int] = set()
        for job in live:
            if job not in ids:
                ids[job] = job_of(job)
            own = ids[job]
            if own == IDLE:
                continue  # a spare with no job started nothing
            if not mark or own is UNKNOWN or own == "" or own == mark:
                found.add(job)
        return frozenset(found)
