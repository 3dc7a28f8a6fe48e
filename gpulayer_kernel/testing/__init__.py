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

from .clock import FakeClock
from .processes import GL, ServeProcess, WorkerProcess, kill_homes_under
from .transport import NullTransport
from .waiting import until, wait_until

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
