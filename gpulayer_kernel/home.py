"""The state directory (``$GPULAYER_HOME``, default ``~/.gpulayer``) and its single-owner lock.

One control plane per state directory (DESIGN rule 3). The live owner holds an ``flock`` on
``controlplane.lock`` and writes its address and a client token there (mode 0600); a second process
finding the lock taken connects to that address as a client instead of opening the database behind
the owner's back, or — when the owner serves no address — stops with a clear message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import Unavailable

HOME_ENV = "GPULAYER_HOME"


def home_dir(path: str | Path | None = None) -> Path:
    raw = path or os.environ.get(HOME_ENV) or Path.home() / ".gpulayer"
    home = Path(raw).expanduser()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "gpulayer.db"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def lock(self) -> Path:
        return self.root / "controlplane.lock"


def read_owner(layout: Layout) -> dict[str, Any]:
    try:
        data = json.loads(layout.lock.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


SERVING_SOON = "soon"  # published as "serve" by an owner whose address follows in a moment
SERVING_WAIT = 5.0  # seconds a second process waits for that address


def live_owner(layout: Layout, wait: float = SERVING_WAIT) -> dict[str, Any]:
    """The owner's published info; {} when nobody holds the lock (a killed owner's file stays).

    An owner that serves its API a moment after it starts (``gpulayer run``: not on the way to
    its first job) says so with ``"serve": "soon"``; then this waits up to ``wait`` seconds for
    the address rather than report an owner that cannot be reached yet.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(layout.lock, os.O_RDWR)
        except FileNotFoundError:
            return {}
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = read_owner(layout)  # held: the owner is alive
            # Empty: it took the lock and has not written it yet (or is rewriting it).
            coming = not info or (info.get("serve") == SERVING_SOON and "url" not in info)
            if not coming or time.monotonic() > deadline:
                return info
        else:
            return {}
        finally:
            os.close(fd)  # closing drops our lock, if we took it
        time.sleep(0.02)  # another process's start-up, not a hot path


class StateLock:
    """An exclusive flock on the state directory, released when the holder exits (even by kill)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.layout.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = read_owner(self.layout)
            raise Unavailable(
                f"{self.layout.root} is in use by another GPUlayer control plane "
                f"(pid {owner.get('pid', '?')})",
                hint="run this command against it with GPULAYER_URL/GPULAYER_TOKEN, stop it, or "
                "set GPULAYER_HOME to another folder",
                details={"home": str(self.layout.root), "owner": owner.get("pid")},
                code="home_locked",
            ) from None
        self._fd = fd
        self.publish({})

    def publish(self, info: dict[str, Any]) -> None:
        """Record the owner's pid (and address/token, when it serves one) for other processes."""
        if self._fd is None:
            return
        data = json.dumps({"pid": os.getpid(), **info}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fchmod(self._fd, 0o600)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None
