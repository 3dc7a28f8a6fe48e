"""How a worker runs its jobs: the one settings object the agent hands to every executor."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..contracts.workspace import WorkerShares


@dataclass
class ExecutorConfig:
    """Settings of one worker's job executors (where jobs live, how they are stopped, …)."""

    work_root: Path
    kill_grace: float = 5.0
    extra_env_allowed: tuple[str, ...] = ()
    keep_job_dirs: bool = False
    python: str = sys.executable
    advertise_addr: str = "127.0.0.1"
    rendezvous_timeout: float = 120.0
    # Unpacked bundles kept on disk (worker/bundlecache.py), least recently used evicted first.
    bundle_cache_bytes: int = 2 << 30
    # Fork single-process Python jobs from a warm interpreter (worker/zygote.py): saves the job's
    # interpreter start-up and imports. GPULAYER_WARM_RUNNER=0 turns it off.
    warm_runner: bool = field(
        default_factory=lambda: os.environ.get("GPULAYER_WARM_RUNNER", "1") != "0"
    )
    # Python jobs' processes forked ahead of time (worker/spares.py): a job takes a ready one,
    # no fork on its critical path. GPULAYER_WARM_POOL=0 forks each job when it comes.
    warm_pool: int = field(default_factory=lambda: _env_int("GPULAYER_WARM_POOL", 2, 0, 16))
    # Start the sessions' zygote (IPython, torch) with the worker, not at its first session: a
    # GPU kernel's or session's first cell then finds torch imported (worker/warm.py).
    # GPULAYER_WARM_SESSIONS=1 or 0; unset or "auto" (None): on where the worker has a GPU
    # that is not simulated.
    warm_sessions: bool | None = field(
        default_factory=lambda: _env_switch("GPULAYER_WARM_SESSIONS")
    )
    # How long a job's "started" and first log lines wait to travel with what follows
    # (worker/reports.py): a job that ends sooner is reported in one request, start to result.
    report_linger: float = 0.05
    # What this worker sees of the Jupyter hosts' disks (its registration's, ADR 0022): a
    # one-shot job's workspace is decided here from it, with no request.
    shares: WorkerShares | None = None


def _env_switch(name: str) -> bool | None:
    """A worker setting that is on ("1"), off ("0") or automatic (unset, "", "auto": None)."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "0"):
        return raw == "1"
    from ..errors import InvalidInput

    raise InvalidInput(
        f"{name}={raw!r} is not 1, 0 or auto",
        hint=f"unset {name} for auto, or set 1 (on) or 0 (off)",
        details={"field": name, "value": raw},
    )


def _env_int(name: str, default: int, low: int, high: int) -> int:
    """An integer worker setting from the environment, or a clear error naming it."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        from ..errors import InvalidInput

        raise InvalidInput(
            f"{name}={raw!r} is not a whole number from {low} to {high}",
            hint=f"unset {name} for the default ({default}), or give a number in that range",
            details={"field": name, "value": raw},
        )
    return int(raw)
