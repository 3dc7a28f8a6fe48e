"""Every process a test run starts ends with the run, whatever ends it (a pytest plugin).

A suite interrupted by Ctrl-C or SIGTERM used to leave ``slurmstepd``, a ``gpulayer worker``, a
``jupyterlab``, ``postgres`` and a ``gpulayer serve`` running (issue 32, item 13). Fixtures start
their processes in sessions of their own (so a job's group can be stopped whole), so a signal to
the run's process group does not reach them, and a killed pytest runs no teardown. Four parts:

- **A mark.** Each pytest process (the xdist controller and every worker) puts
  ``GPULAYER_TEST_OWNER=<pid>:<start time>`` in its environment; every process it starts
  inherits it, and so do theirs (a ``gpulayer serve``'s workers, PostgreSQL's backends,
  ``slurmd``'s steps). The start time (``/proc/PID/stat`` field 22) tells a live owner from a
  reused pid.
- **A watchdog per pytest process** (``python -m gpulayer_kernel.testing.reaper --watch``, in
  a session of its own, so Ctrl-C to the terminal's group leaves it be): when its owner is gone,
  by any means, it ends every process that carries the owner's mark, and their descendants
  (collected before the first signal: a killed parent's children would be orphaned), SIGTERM
  first (a server stops its workers, PostgreSQL shuts down), SIGKILL after ``GRACE`` seconds.
  Single pids, never a process group: a process may share its group with one still needed.
- **SIGTERM is Ctrl-C** in a pytest process: fixtures tear down as on ``KeyboardInterrupt``. An
  xdist worker whose controller died interrupts itself the same way.
- **A reaper at session start** (``pytest_sessionstart`` of the run's first process): the marked
  processes of earlier runs whose owner is gone (their watchdog killed too) are ended the same
  way. Another run's processes on a shared machine carry a live owner and are left alone.
- **Folders, for what sheds the mark.** A daemon that clears its environment and leaves its
  parent (``slurmstepd``: reparented to init, no environment of ours) is found by the files it
  holds open under a folder its fixture registered (``register_root``: a Slurm cluster's):
  once the folder's owner is gone, such a process is ended too.

``_Process`` (``processes.py``) also starts its children with ``PR_SET_PDEATHSIG`` (through
``setpriv --pdeathsig``, from the main thread only: the signal follows the thread that forked).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

OWNER_ENV = "GPULAYER_TEST_OWNER"
ROOTS = Path(tempfile.gettempdir()) / "gpulayer-test-roots"  # one file per registered folder
GRACE = 10.0  # seconds between SIGTERM and SIGKILL
WATCH_EVERY = 0.5  # seconds between a watchdog's looks at its owner


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def mark(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid)}"


def alive(owner: str) -> bool:
    """Whether the process a mark names still runs (the same process, not a reused pid)."""
    pid, _, started = owner.partition(":")
    return pid.isdigit() and started.isdigit() and str(start_time(int(pid))) == started


def _environ_mark(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    key = f"{OWNER_ENV}=".encode()
    for item in env:
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


_WATCHDOG = b"gpulayer_kernel.testing.reaper\0--watch"


def _is_watchdog(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return _WATCHDOG in f.read()
    except OSError:
        return False


def _table() -> dict[int, tuple[int, str | None]]:
    """Every process but the watchdogs: pid -> (parent pid, its owner mark). A watchdog is the
    child of the process it watches, and must outlive it to do its work."""
    out: dict[int, tuple[int, str | None]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if _is_watchdog(pid):
            continue
        out[pid] = (ppid, _environ_mark(pid))
    return out


def _ancestors(pid: int, table: dict[int, tuple[int, str | None]]) -> set[int]:
    seen: set[int] = set()
    while pid in table and pid not in seen and pid > 1:
        seen.add(pid)
        pid = table[pid][0]
    return seen


def register_root(folder: Path) -> Path | None:
    """Say that processes holding files under ``folder`` belong to this test process (see the
    module docstring); the registration's file (None outside a marked test process)."""
    owner = os.environ.get(OWNER_ENV)
    if not owner:
        return None
    ROOTS.mkdir(parents=True, exist_ok=True)
    entry = ROOTS / f"{owner.replace(':', '-')}-{abs(hash(str(folder)))}"
    entry.write_text(f"{owner}\n{folder.resolve()}\n")
    return entry


def _roots(wanted: set[str] | None) -> tuple[list[str], list[Path]]:
    """The registered folders of ``wanted`` owners (None: of owners that are gone)."""
    folders: list[str] = []
    entries: list[Path] = []
    for entry in ROOTS.glob("*") if ROOTS.is_dir() else ():
        try:
            owner, folder = entry.read_text().split("\n")[:2]
        except (OSError, ValueError):
            continue
        if (owner in wanted) if wanted is not None else not alive(owner):
            folders.append(folder.rstrip("/") + "/")
            entries.append(entry)
    return folders, entries


def _holds_under(pid: int, folders: list[str]) -> bool:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith(tuple(folders)):
            return True
    return False


def leftovers(owners: Iterable[str] | None = None) -> list[int]:
    """The processes to end: those marked by one of ``owners`` (None: by any owner that is gone),
    those holding files under a folder such an owner registered, and all their descendants;
    never this process, its ancestors, or pid 1."""
    table = _table()
    wanted = set(owners) if owners is not None else None
    roots = {
        pid
        for pid, (_, owner) in table.items()
        if owner is not None and (owner in wanted if wanted is not None else not alive(owner))
    }
    folders, _ = _roots(wanted)
    if folders:
        roots |= {pid for pid in table if _holds_under(pid, folders)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    keep = _ancestors(os.getpid(), table) | {1, os.getpid()}
    return sorted(found - keep)


def end(pids: list[int], grace: float = GRACE) -> list[int]:
    """SIGTERM each pid, then SIGKILL what still runs after ``grace`` seconds; the pids ended.
    Each pid is checked against its start time before the SIGKILL (never a reused pid)."""
    started = {pid: start_time(pid) for pid in pids}
    live = [pid for pid in pids if started[pid] is not None]
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if all(start_time(pid) != started[pid] for pid in live):
            return live
        time.sleep(0.1)  # waiting for other processes to exit, not a hot path
    for pid in live:
        if start_time(pid) == started[pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return live


def reap(owners: Iterable[str] | None = None, grace: float = GRACE) -> list[int]:
    """End the leftovers of ``owners`` (None: of every owner that is gone); the pids ended.
    Their folders' registrations go too."""
    wanted = set(owners) if owners is not None else None
    ended = end(leftovers(wanted), grace)
    for entry in _roots(wanted)[1]:
        entry.unlink(missing_ok=True)
    return ended


def watch(owner: str, every: float = WATCH_EVERY) -> None:
    """Wait until ``owner`` is gone, then end what it left (the watchdog's life)."""
    while alive(owner):
        time.sleep(every)  # a watchdog's poll, not a hot path
    reap([owner])


def start_watchdog(owner: str) -> subprocess.Popen[bytes]:
    """The watchdog of ``owner``: its own session (a Ctrl-C to the run's group leaves it be),
    no mark of its own (it must not end itself), no stdio."""
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    return subprocess.Popen(
        [sys.executable, "-m", "gpulayer_kernel.testing.reaper", "--watch", owner],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _follow_controller(controller: int) -> None:
    """An xdist worker whose controller died interrupts itself (its fixtures tear down), and
    exits after ``GRACE`` seconds more if that hangs."""
    while os.getppid() == controller:
        time.sleep(WATCH_EVERY)  # a watchdog's poll, not a hot path
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(GRACE * 3)
    os._exit(3)


# -- the pytest plugin ----------------------------------------------------------------------------


def pytest_configure(config: Any) -> None:
    """Mark this pytest process's children, start its watchdog, and take SIGTERM as Ctrl-C."""
    owner = mark()
    os.environ[OWNER_ENV] = owner
    config._gl_watchdog = start_watchdog(owner)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        threading.Thread(
            target=_follow_controller, args=(os.getppid(),), name="gl-follow", daemon=True
        ).start()


def pytest_sessionstart(session: Any) -> None:
    """The run's first process ends what earlier runs left (their owner and watchdog gone)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    ended = reap(grace=5.0)
    if ended:
        sys.stderr.write(
            f"gpulayer: ended {len(ended)} process(es) left by earlier test runs "
            f"(pids {', '.join(map(str, ended[:12]))}{' …' if len(ended) > 12 else ''})\n"
        )


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--watch":
        # Neither the terminal's Ctrl-C nor another run's reaper is for it: it ends by itself.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        watch(argv[1])
        return 0
    if argv == ["--reap"]:
        print("\n".join(map(str, reap())))
        return 0
    print("usage: python -m gpulayer_kernel.testing.reaper --watch PID:START | --reap")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
