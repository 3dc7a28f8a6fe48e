"""Helpers for the tests of several folders.

The shared fixtures (``gl_home``, ``gl_clock``, ``gl_fake_clock``, ``gl_cp``, ``gl_worker``,
``gl_postgres``) ship in ``gpulayer_kernel/pytest_plugin.py`` (loaded by the root
``conftest.py``); what must hold for every path pytest is given lives in the root ``conftest.py``.
The names below are re-exported for the tests that import them from here."""

from __future__ import annotations

from gpulayer_kernel.pytest_plugin import WorkerFactory, pid_alive, sim_caps

__all__ = ["WorkerFactory", "pid_alive", "sim_caps"]
