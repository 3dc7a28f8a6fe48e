"""A workaround for jupyter_client 8.10: a kernel whose start failed stops the server's shutdown.

jupyter_client keeps such a kernel in ``MultiKernelManager._pending_kernels`` (its start task is
done; the kernel was never added), so ``shutdown_all`` asks for it, gets a 404 (``Kernel does not
exist``) and stops there: the Jupyter server's shutdown ends with that error, and the process waits
to be killed. A GPU kernel whose start failed (no GPU within its ``--wait``) is one; so is any
kernel whose command cannot run. The server extension forgets them as it stops, which Jupyter does
before it shuts its kernels down. The upstream reproduction is in ADR 0021.
"""

from __future__ import annotations

import logging
from typing import Any


def forget_failed_starts(kernels: Any, logger: logging.Logger) -> None:
    """Drop the kernels whose start failed from ``kernels``' pending starts (a jupyter_client
    ``MultiKernelManager``; anything else is left alone)."""
    pending = getattr(kernels, "_pending_kernels", None)
    started = getattr(kernels, "_kernels", None)
    if not isinstance(pending, dict) or not isinstance(started, dict):
        return
    for kernel_id, task in list(pending.items()):
        if kernel_id not in started and getattr(task, "done", lambda: False)():
            del pending[kernel_id]
            logger.info("GPUlayer: forgot kernel %s, whose start had failed", kernel_id)
