"""Shipped test helpers, for this project's tests and for anyone building on GPUlayer.

- :class:`FakeClock`: a :class:`gpulayer_kernel.clock.Clock` that moves only when told to.
- :func:`wait_until` / :func:`until`: wait for a condition with a deadline, instead of fixed sleeps.
- :class:`ServeProcess`, :class:`WorkerProcess`: real ``gpulayer serve`` / ``gpulayer worker``
  processes in their own sessions, stopped when the ``with`` block ends.
- :class:`NullTransport`: a worker transport that takes every report and never has work.
- ``testing.slurm.SlurmCluster``, ``testing.sshd.SSHServer``: a real Slurm 22.05 and OpenSSH
  server on ports and in a directory chosen at run time (the provider tests' engines).
- ``testing.machines.InProcessMachines``: in-process machines for ``FakeProvider``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .clock import FakeClock
from .waiting import until, wait_until

if TYPE_CHECKING:
    from .processes import GL, ServeProcess, WorkerProcess, kill_homes_under
    from .transport import NullTransport

# Imported on first use: pytest loads ``testing.reaper`` and ``gpulayer_kernel.pytest_plugin`` (so
# this package) in every run, and these two pull in the control plane (~300 ms, pydantic).
_LAZY = {
    **dict.fromkeys(["GL", "ServeProcess", "WorkerProcess", "kill_homes_under"], "processes"),
    "NullTransport": "transport",
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "GL",
    "FakeClock",
    "NullTransport",
    "ServeProcess",
    "WorkerProcess",
    "kill_homes_under",
    "until",
    "wait_until",
]
