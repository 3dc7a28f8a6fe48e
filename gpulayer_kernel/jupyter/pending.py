"""Workarounds for jupyter_client 8.10: kernels that stop the Jupyter server's shutdown.

**A kernel whose start failed.** jupyter_client keeps it in
``MultiKernelManager._pending_kernels`` (its start task is done; the kernel was never added), so
``shutdown_all`` asks for it, gets a 404 (``Kernel does not exist``) and stops there: the Jupyter
server's shutdown ends with that error, and the process waits to be killed. A GPU kernel whose
start failed (no GPU within its ``--wait``) is one; so is any kernel whose command cannot run.

**A kernel being restarted.** ``shutdown_all`` reads each kernel's ``ready`` future's exception;
while a restart is under way that future is not done, the read raises ``InvalidStateError``, and
the shutdown stops the same way. Stopping the extension's control plane is what makes this likely:
its local worker stops the kernels' processes, the relays report them dead, and jupyter_client's
auto-restarter starts them again (against a control plane that is gone) just as Jupyter shuts its
kernels down.

The server extension deals with both as it stops, which Jupyter does before it shuts its kernels
down: :func:`settle_restarts` before its control plane stops, :func:`forget_failed_starts` after.
The upstream reproductions are in ADR 0021.
"""

from __future__ import annotations

import asyncio
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


async def settle_restarts(kernels: Any, logger: logging.Logger, timeout: float = 15.0) -> None:
    """Stop the auto-restarter of each of ``kernels``' kernels (the server shuts them all down
    next: a kernel that dies now is not to be started again), then wait, ``timeout`` seconds at
    most, for the restarts and shutdowns already under way to end."""
    started = getattr(kernels, "_kernels", None)
    if not isinstance(started, dict):
        return
    for km in list(started.values()):
        stop = getattr(km, "stop_restarter", None)
        if callable(stop):
            stop()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while busy := [kid for kid, km in list(started.items()) if _changing(km)]:
        if loop.time() >= deadline:
            logger.warning("GPUlayer: kernels still restarting as the server stops: %s", busy)
            return
        await asyncio.sleep(0.05)


def _changing(km: Any) -> bool:
    """A restart or shutdown is under way: its shutdown half sets ``shutting_down`` (its start
    clears it), its start half runs with a ``ready`` future not yet done."""
    ready = getattr(km, "_ready", None)
    return bool(getattr(km, "shutting_down", False)) or (ready is not None and not ready.done())
