"""How a worker runs its jobs: the one settings object the agent hands to every executor."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


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
