"""The per-machine probe cache: one full probe per machine, interpreter, torch build and driver.

The full probe imports torch in a subprocess (1-2 s of CPU). Its answer depends on this machine
and this Python, not on ``$GPULAYER_HOME``, so it is kept once per machine in
``$GPULAYER_CACHE_DIR`` (default ``$XDG_CACHE_HOME/gpulayer``, else ``~/.cache/gpulayer``), one
file per key, where the key (``machine_key``) is a hash of everything the answer depends on:

* the machine: host name and ``/etc/machine-id`` (a home folder shared over NFS serves several),
  the OS and kernel release;
* the interpreter: its real path, version and prefix (each virtual environment has its own);
* the torch install (``build.install_stamp``: any reinstall or upgrade rewrites ``version.py``);
* the drivers (``driver.DriverFacts.identity``: versions and the GPUs bound, by UUID), so a new
  driver or a GPU added, removed or fallen off the bus means a new probe;
* ``CUDA_VISIBLE_DEVICES`` and its ROCm twins, which change what torch sees;
* the package version and ``FORMAT`` (bumped when what the probe reports changes).

An entry also expires after ``TTL`` (what the key cannot see, e.g. a CUDA runtime upgraded under
the same driver, is re-checked daily). Writes are atomic (a temporary file renamed), and a lock
file per key lets one process probe while the others wait for its answer instead of probing too.
A cache that cannot be read or written is no cache: the probe runs, nothing fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .build import TorchBuild, install_stamp
from .driver import DriverFacts

CACHE_ENV = "GPULAYER_CACHE_DIR"
FORMAT = 2  # what an entry holds; bump when the probe's answer changes meaning
TTL = 24 * 3600.0
PRUNE_AFTER = 30 * 24 * 3600.0  # entries of old keys (an upgraded torch) go after a month
VISIBLE_ENVS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where this user's per-machine cache lives."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gpulayer"


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            return Path(path).read_text().strip()
    return ""


def machine_key(
    drivers: DriverFacts,
    build: TorchBuild | None,
    env: Mapping[str, str] | None = None,
    *,
    torch_stamp: str | None = None,
) -> str:
    """The cache key for a probe of this machine now (see the module docstring)."""
    from .. import __version__

    env = os.environ if env is None else env
    parts = [
        f"format={FORMAT}",
        f"gpulayer={__version__}",
        f"host={socket.gethostname()}",
        f"machine={_machine_id()}",
        f"os={platform.system()} {platform.release()} {platform.machine()} {platform.mac_ver()[0]}",
        f"python={os.path.realpath(sys.executable)} {sys.version} {sys.prefix}",
        f"torch={torch_stamp if torch_stamp is not None else install_stamp(build)}",
        f"drivers={drivers.identity()}",
        *(f"{name}={env.get(name, '<unset>')}" for name in VISIBLE_ENVS),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class MachineCache:
    """Probe answers by key, one JSON file each, in ``folder``."""

    def __init__(self, folder: Path, ttl: float = TTL) -> None:
        self.folder = folder
        self.ttl = ttl

    def path(self, key: str) -> Path:
        return self.folder / f"probe-{key[:24]}.json"

    def lock_path(self, key: str) -> Path:
        return self.folder / f"probe-{key[:24]}.lock"

    def read(self, key: str, now: float | None = None) -> dict[str, Any] | None:
        """The capabilities (as JSON data) cached under ``key``, if fresh; else None."""
        try:
            data = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != key or data.get("format") != FORMAT:
            return None
        written = data.get("written")
        now = time.time() if now is None else now
        if not isinstance(written, (int, float)) or not 0 <= now - written < self.ttl:
            return None
        caps = data.get("capabilities")
        return caps if isinstance(caps, dict) else None

    def write(self, key: str, capabilities: dict[str, Any], now: float | None = None) -> bool:
        """Keep ``capabilities`` under ``key`` (atomically); False if the folder is unwritable."""
        data = {
            "format": FORMAT,
            "key": key,
            "written": time.time() if now is None else now,
            "capabilities": capabilities,
        }
        tmp: str | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".probe-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path(key))
        except OSError:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False
        self.prune(keep=key)
        return True

    def prune(self, keep: str, now: float | None = None) -> None:
        """Remove entries of other keys not written for ``PRUNE_AFTER``."""
        now = time.time() if now is None else now
        with contextlib.suppress(OSError):
            for path in self.folder.glob("probe-*.json"):
                if path != self.path(keep) and now - path.stat().st_mtime > PRUNE_AFTER:
                    with contextlib.suppress(OSError):
                        path.unlink()
