"""One worker's warm runner: the fork servers its jobs start from (``zygote.py``).

:class:`WarmRunner` is owned by its worker's agent and handed to each executor: it starts the
fork servers it needs (lazily), replaces one that dies, gives up (warning once) on one that
cannot start, and stops them with the worker. ``prewarm`` starts one ahead of its first job
(a GPU worker's sessions' zygote, when the worker starts: ``warm_sessions``). With a preload
(torch where installed) the Python jobs that import torch (``needs_torch.py``, judged from
their source) get a zygote of their own that imports it, while other Python jobs and commands
fork from a light one: forking (and later unmapping) a torch-loaded process costs ~10-15 ms
that they do not need. What each zygote imports is chosen here too (``env_preload``,
``session_preload``); a zygote itself is a :class:`~.zygote_client.ZygoteClient`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import WorkerCapabilities
from .config import ExecutorConfig
from .env import base_env
from .needs_torch import entry_needs_torch
from .spares import ZygoteChild
from .zygote import PRELOAD_ENV, STARTUP_VARS
from .zygote_client import ZygoteClient, ZygoteUnavailable

__all__ = ["SESSION_PRELOAD_ENV", "WarmRunner", "env_preload", "session_preload", "warm_sessions"]

log = logging.getLogger("gpulayer.worker")


def env_preload() -> tuple[str, ...]:
    """What the Python jobs' zygote imports: ``GPULAYER_ZYGOTE_PRELOAD`` (comma-separated; set
    it empty for nothing), by default torch and numpy where this interpreter has them."""
    configured = os.environ.get(PRELOAD_ENV)
    if configured is not None:
        return tuple(m.strip() for m in configured.split(",") if m.strip())
    return _installed("torch", "numpy")


def _installed(*names: str) -> tuple[str, ...]:
    return tuple(m for m in names if importlib.util.find_spec(m) is not None)


SESSION_PRELOAD_ENV = "GPULAYER_SESSION_PRELOAD"
"""Worker setting: the modules a session's zygote imports besides IPython (default: torch and
numpy where installed; set it empty for IPython alone)."""


def session_preload() -> tuple[str, ...]:
    """What a session's zygote imports: IPython's shell and the session host, then torch and
    numpy where this interpreter has them (``GPULAYER_SESSION_PRELOAD`` overrides the two)."""
    base = ("IPython.core.interactiveshell", "gpulayer_kernel.worker.sessions.host")
    configured = os.environ.get(SESSION_PRELOAD_ENV)
    if configured is not None:
        extra = tuple(m.strip() for m in configured.split(",") if m.strip())
    else:
        extra = _installed("torch", "numpy")
    return base + extra


def warm_sessions(setting: bool | None, capabilities: WorkerCapabilities) -> bool:
    """Whether a worker starts its sessions' zygote when it starts (``ExecutorConfig.
    warm_sessions``): as set, or automatically where it has a GPU that is not simulated, a
    machine kept for GPU work, whose first kernel should not wait for torch's import (~1.5 s
    of a core, ~300 MiB held while idle). Elsewhere the zygote starts with the first session."""
    if setting is not None:
        return setting
    return any(d.vendor not in ("sim", "cpu") for d in capabilities.devices)


Launch = Callable[[ZygoteClient], Awaitable[ZygoteChild]]


class WarmRunner:
    """One worker's zygotes: started by the first job that needs one, replaced if one dies,
    stopped with the worker.

    The agent owns it and hands it to every executor, so each worker has its own fork servers
    (with its own ``python`` and allow-listed environment), and stopping a worker stops them.
    Python jobs that import torch fork from a zygote that imported ``preload()``; while that one
    is still importing (torch: ~2 s), and for every other Python job, from the light one. Each
    keeps ``pool`` spares. Commands always fork from the light one (``preload`` empty: the two
    are one).
    """

    def __init__(
        self,
        config: ExecutorConfig,
        clock: Clock = SYSTEM_CLOCK,
        preload: Callable[[], tuple[str, ...]] | None = None,
        pool: int | None = None,
    ) -> None:
        """``preload``: what Python jobs' zygote imports (default: ``env_preload``);
        ``pool``: spares it keeps (default: ``config.warm_pool``)."""
        self.config = config
        self.clock = clock
        self._preload = preload or env_preload
        self._pool = config.warm_pool if pool is None else pool
        self._clients: dict[tuple[str, ...], ZygoteClient] = {}
        self._finalizers: dict[tuple[str, ...], weakref.finalize[[], WarmRunner]] = {}
        self._starting: dict[tuple[str, ...], asyncio.Task[ZygoteClient]] = {}
        self._broken: set[tuple[str, ...]] = set()  # failed to start: likely to fail again
        self._warned = False
        self.closed = False  # closed by its owner: no zygote is started any more

    @property
    def pid(self) -> int | None:
        """The pid of the Python jobs' live zygote, else the light one's (for tests)."""
        for key in (self._preload(), ()):
            client = self._clients.get(key)
            if client is not None and not client.dead and client.zygote_pid is not None:
                return client.zygote_pid
        return None

    def spares(self, light: bool = False) -> int:
        """Idle spares ready for Python jobs now (for tests and diagnostics)."""
        return len(self.spare_pids(light))

    def spare_pids(self, light: bool = False) -> list[int]:
        """The supervisor pids of the idle spares, oldest first (for tests and diagnostics):
        the preloading zygote's, or with ``light`` the light one's (one and the same without a
        preload)."""
        client = self._clients.get(() if light else self._preload())
        return [s.pid for s in client.spares] if client is not None and not client.dead else []

    async def spawn(
        self,
        entrypoint: str,
        cwd: Path,
        env: dict[str, str],
        stdin: int | None = None,
        sources: dict[str, str] | None = None,
    ) -> ZygoteChild | None:
        """Launch a Python job through a zygote; None means "use the cold spawn"."""
        if any(k in STARTUP_VARS for k in env):
            return None
        preload = self._preload()
        key = preload
        # Started (in the background) by any Python job, so that it is ready for the first job
        # that needs it; only those jobs fork from it: a torch-loaded fork costs a light job
        # ~10 ms of page-table work at its start and end.
        if preload and not (
            await self._usable(preload) and entry_needs_torch(entrypoint, cwd, sources)
        ):
            key = ()  # light work, or the preloading zygote still imports: the light one
        return await self._launch(key, lambda c: c.spawn(entrypoint, cwd, env, stdin, sources))

    async def exec(self, argv: list[str], cwd: Path, env: dict[str, str]) -> ZygoteChild | None:
        """Launch a command through the light zygote (``posix_spawn`` from it: no interpreter
        start-up for a supervisor); None means "use the cold spawn". Raises ``LaunchFailed``
        when the command cannot be executed."""
        return await self._launch((), lambda c: c.exec(argv, cwd, env))

    def prewarm(self) -> None:
        """Start the preloading zygote now, in the background (from a running loop): the first
        job that wants it finds it up. A zygote that cannot start is said when a job asks."""
        key = self._preload()
        if key and not self.closed and key not in self._broken and not self.warm():
            self._start_task(key)

    def warm(self) -> bool:
        """Whether the preloading zygote (the light one without a preload) serves now."""
        client = self._clients.get(self._preload())
        return client is not None and not client.dead and client.ready

    async def _usable(self, key: tuple[str, ...]) -> bool:
        """Whether the zygote for ``key`` serves now; starts it in the background if not."""
        if self.closed or key in self._broken:
            return False
        client = self._clients.get(key)
        if client is not None and self._current(client, key) and client.ready:
            return True
        self._start_task(key)
        return False

    def _start_task(self, key: tuple[str, ...]) -> asyncio.Task[ZygoteClient]:
        """The start of the zygote for ``key`` under way, or a new one."""
        task = self._starting.get(key)
        if task is None or task.done():
            task = self._starting[key] = asyncio.create_task(self._start(key))
            task.add_done_callback(_retrieved)
        return task

    def _current(self, client: ZygoteClient, key: tuple[str, ...]) -> bool:
        return not (
            client.dead
            or client.loop is not asyncio.get_running_loop()
            or client.python != self.config.python
            or client.preload != key
        )

    async def _launch(self, key: tuple[str, ...], launch: Launch) -> ZygoteChild | None:
        if self.closed:
            return None
        try:
            client = await self._running(key)
            child = await launch(client)
        except ZygoteUnavailable as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "warm runner unavailable (%s); jobs start from a fresh interpreter", exc
                )
            return None
        if self.closed:  # closed while this launch was under way: it must not outlive us
            child.stop_now()
            child.close()
            return None
        return child

    async def _running(self, key: tuple[str, ...]) -> ZygoteClient:
        if key in self._broken:
            raise ZygoteUnavailable("it failed to start before")
        client = self._clients.get(key)
        if client is not None and self._current(client, key) and client.ready:
            return client
        return await asyncio.shield(self._start_task(key))

    async def _start(self, key: tuple[str, ...]) -> ZygoteClient:
        self._drop(key)
        # The zygote starts from the allow-listed worker environment: no secrets in its memory.
        env = base_env(extra_allowed=self.config.extra_env_allowed)
        # Both keep spares: light Python jobs are handed to the light one's.
        pool = self._pool
        client = ZygoteClient(self.config.python, key, env, self.clock, pool=pool)
        self._clients[key] = client
        # A worker dropped without stop() still hangs up on its zygote when it is collected.
        self._finalizers[key] = weakref.finalize(self, client.close)
        try:
            await client.start()
        except ZygoteUnavailable:
            self._broken.add(key)
            raise
        finally:
            if self._starting.get(key) is asyncio.current_task():
                del self._starting[key]
        if self.closed:
            self._drop(key)
            raise ZygoteUnavailable("closed while it started")
        return client

    def close(self) -> None:
        """Stop and reap the zygotes now (and any job still running in them), for good.

        Called by its owner (the agent's ``stop``); idempotent. Jobs launched afterwards take
        the cold spawn, so no zygote is started behind a closed owner's back.
        """
        self.closed = True
        for task in self._starting.values():
            task.cancel()
        for key in list(self._clients):
            self._drop(key)

    def _drop(self, key: tuple[str, ...]) -> None:
        """Stop the zygote for ``key`` (a later job starts a new one)."""
        finalizer = self._finalizers.pop(key, None)
        if finalizer is not None:
            finalizer()  # closes the client, once
        self._clients.pop(key, None)


def _retrieved(task: asyncio.Task[ZygoteClient]) -> None:
    """A background start's failure is warned about by the next launch that needs it."""
    if not task.cancelled():
        task.exception()
