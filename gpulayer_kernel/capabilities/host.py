"""Facts about the host a worker runs on, read in microseconds; a missing one keeps its default.

Its own module so that a local worker's first answer (``local.py``) needs neither the probe's
readers nor their imports.
"""

from __future__ import annotations

import os
import platform
import socket

from ..contracts import HostFacts


def read_host(platform_name: str | None = None) -> HostFacts:
    """Facts about the host; each missing one is left at its default rather than failing."""
    cpus = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        try:
            cpus = len(os.sched_getaffinity(0)) or cpus
        except OSError:
            pass
    memory = 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    return HostFacts(
        hostname=socket.gethostname(),
        os=(platform_name or platform.system()).lower(),
        arch=platform.machine().lower(),
        cpus=max(1, cpus),
        memory_bytes=max(0, memory),
        python=platform.python_version(),
    )
