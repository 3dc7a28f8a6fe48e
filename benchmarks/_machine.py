"""What machine a benchmark ran on, printed beside its figures (BENCHMARKING.md asks for it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> str:
    """e.g. ``AMD EPYC, 2 cores, Python 3.11.7``."""
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"
