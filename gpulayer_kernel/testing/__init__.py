"""Shipped test helpers, for this project's tests and for anyone building on GPUlayer.

- :class:`FakeClock`: a :class:`gpulayer_kernel.clock.Clock` that moves only when told to.
- :func:`wait_until` / :func:`until`: wait for a condition with a deadline, instead of fixed sleeps.
- :class:`ServeProcess`, :class:`WorkerProcess`: real ``gpulayer serve`` / ``gpulayer worker``
  processes in their own sessions, stopped when the ``with`` block ends.
- :class:`NullTransport`: a worker transport that takes every report and never has work.
"""

from __future__ import annotations

from .clock import FakeClock
from .processes import GL, ServeProcess, WorkerProcess
from .transport import NullTransport
from .waiting import until, wait_until

__all__ = [
    "GL",
    "FakeClock",
    "NullTransport",
    "ServeProcess",
    "WorkerProcess",
    "until",
    "wait_until",
]
