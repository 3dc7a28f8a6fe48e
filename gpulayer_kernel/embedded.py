"""The embedded default: a ControlPlane on SQLite under ``$GPULAYER_HOME`` and a local worker.

No server to start: ``gpulayer run``, plain IPython and tests open one of these in-process. It
takes the state directory's lock for as long as it lives. With ``serve=ServeOptions(...)`` it also
serves the HTTP API (127.0.0.1, a random port by default) and publishes its address and a fresh
client token in the lock file (mode 0600), so a ``gpulayer jobs`` in another terminal connects to
it instead of failing on the lock (DESIGN rule 3); ``gpulayer serve`` is this with a fixed port.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .contracts.limits import HEARTBEAT_TIMEOUT
from .home import SERVING_SOON, Layout, StateLock, home_dir

if TYPE_CHECKING:
    from .api import ApiLimits, ApiServer
    from .capabilities.local import LocalProbe
    from .contracts import WorkerCapabilities
    from .controlplane import ControlPlane
    from .providers import ProvidersConfig
    from .security import TokenService
    from .store import MetadataStore
    from .worker.agent import WorkerAgent

__all__ = ["LOCAL_TOKEN_NAME", "Embedded", "ServeOptions", "follow_probe"]

log = logging.getLogger("gpulayer.embedded")
SERVE_SOON_WITHIN = 1.0  # seconds a `soon` API waits for the first job's end before serving
# The client token published in the lock file for local commands; replaced at every start.
LOCAL_TOKEN_NAME = "local-session"


@dataclass(frozen=True)
class ServeOptions:
    """Where and how an Embedded control plane serves the HTTP API."""

    host: str = "127.0.0.1"
    port: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    ca_cert: str | None = None  # what local clients should trust; default: the certificate
    limits: ApiLimits | None = None
    # Serve a moment after start (the first job's end, or SERVE_SOON_WITHIN seconds), off the
    # way to the first result: `gpulayer run` publishes its address for other terminals that late.
    soon: bool = False
    # Every URL of the cluster's control planes (an active and its standbys): what workers the
    # autoscaler launches dial, so they follow a failover; empty: this server's own URL.
    urls: tuple[str, ...] = ()


async def follow_probe(agent: WorkerAgent, probed: LocalProbe) -> WorkerCapabilities | None:
    """Once the background probe answers, re-register ``agent`` with what it found (if that
    differs from what it joined with): the same worker id, its jobs untouched."""
    caps = await probed.checked()
    if caps is None or caps == agent.registration.capabilities:
        return caps
    agent.registration = agent.registration.model_copy(update={"capabilities": caps})
    try:
        agent.info = await agent.transport.register(agent.registration)
    except Exception as exc:  # it keeps its first answer; the next start reads the cache
        log.warning("could not re-register with the full probe's answer: %s", exc)
        return None
    log.info(
        "worker %s: capabilities confirmed by the full probe (%d GPU(s), %s)",
        agent.registration.name,
        len(caps.devices),
        caps.runtime,
    )
    return caps


def _import_api() -> None:
    from . import api  # noqa: F401  (tornado and the handlers: ~60 ms of imports)


class Embedded:
    """ControlPlane + stores + (optionally) an in-process local worker, as one context."""

    def __init__(
        self,
        home: str | Path | None = None,
        *,
        local_worker: bool = True,
        simulate_gpus: int | None = None,
        simulate_kind: str | None = None,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        worker_name: str | None = None,
        serve: ServeOptions | bool = False,
        pause_gc: bool = False,
        db: str | None = None,
        artifacts: str | Path | None = None,
        secrets_key: str | None = None,
    ) -> None:
        """``db``: a store URL (default: SQLite in the home); ``artifacts``: the blob folder
        (default: in the home; a standby shares it); ``secrets_key``: a key file (default: the
        environment's key, else ``secrets.key`` in the home)."""
        # Imported here, not at the top: `client/connect.py` imports this module for every command,
        # and one that talks to a served control plane needs none of this (issue 14, item 5).
        from .controlplane import ControlPlane
        from .security.vault import key_source
        from .store import LocalArtifactStore, open_store

        self.layout = Layout(home_dir(home))
        self.lock = StateLock(self.layout)
        self.store: MetadataStore = open_store(db or f"sqlite://{self.layout.db}")
        self.cp: ControlPlane = ControlPlane(
            self.store,
            LocalArtifactStore(Path(artifacts) if artifacts else self.layout.artifacts),
            heartbeat_timeout=heartbeat_timeout,
            secrets_key=key_source(self.layout.root, secrets_key),
        )
        # Pausing the collector during a scheduling pass pays (~1.4x on a 10k-job pass) but is
        # only for processes that are the control plane's own (serve, the Jupyter server), never
        # a kernel that embeds it.
        self.cp.scheduling.pause_gc = pause_gc
        self._want_worker = local_worker
        self._simulate = (simulate_gpus, simulate_kind)
        self._worker_name = worker_name or f"local-{socket.gethostname()}"
        self.worker: WorkerAgent | None = None
        self.probe: LocalProbe | None = None
        self._serve = ServeOptions() if serve is True else serve or None
        self.tokens: TokenService | None = None
        self.api: ApiServer | None = None
        self.url: str | None = None
        self._local_token: str | None = None
        self._background: list[asyncio.Task[Any]] = []
        self._providers_config: ProvidersConfig | None = None

    async def start(self) -> Embedded:
        opts = self._serve
        if opts is not None:
            from .security import check_serve

            check_serve(opts.host, opts.tls_cert, opts.tls_key)
        self.lock.acquire()
        if opts is not None and opts.soon:
            self.lock.publish({"serve": SERVING_SOON})  # a second process waits for the address
        try:
            await self.store.open()
            await self.cp.start()
            self._providers_config = await self._providers()
            if opts is not None and not opts.soon:
                await self._start_api(opts)
            if self._want_worker:
                await self._start_worker()
            if opts is not None and opts.soon:
                self._background.append(asyncio.create_task(self._serve_soon(opts)))
        except BaseException:
            await self.stop()
            raise
        if self.cp.scheduling.pause_gc:
            # The control plane's own process (serve, the Jupyter server): what start-up loaded
            # (modules, contracts, the jobs and workers read back) lives as long as the process,
            # so the collector's full passes need not walk it again (issue 25).
            gc.collect()
            gc.freeze()
        return self

    async def _providers(self) -> ProvidersConfig | None:
        """Read the providers config (if any) and hand it to the control plane, its machines
        tagged with the cluster's id (any server leading this store owns them, ADR 0010)."""
        from . import providers

        config = providers.load(providers.config_path(self.layout.root))
        await providers.compare_providers(self.store, config, record=True)
        if config is not None:
            owner = await providers.cluster_id(self.store, self.layout.root)
            built = providers.build(config, home=self.layout.root, owner=owner, clock=self.cp.clock)
            self.cp.provisioning.use(config, built)
        return config

    async def _start_worker(self) -> None:
        from .capabilities.local import local_capabilities
        from .contracts import WorkerRegistration
        from .worker.agent import WorkerAgent
        from .worker.config import ExecutorConfig
        from .worker.transport import InProcessTransport

        # No torch import here: the per-machine cache, or the driver's devices now and the full
        # probe in the background (capabilities/local.py), re-registering once it answers.
        self.probe = probe = await local_capabilities(*self._simulate)
        self.worker = WorkerAgent(
            InProcessTransport(self.cp),
            WorkerRegistration(name=self._worker_name, capabilities=probe.capabilities),
            ExecutorConfig(work_root=self.layout.work),
            clock=self.cp.clock,
            heartbeat_interval=max(0.5, self.cp.heartbeat_timeout / 3),
        )
        await self.worker.start()
        if probe.check is not None:
            self._background.append(asyncio.create_task(follow_probe(self.worker, probe)))

    async def _serve_soon(self, opts: ServeOptions) -> None:
        """Serve once the first job here has ended, or after ``SERVE_SOON_WITHIN`` seconds.

        Never on the way to the first result: tornado's import and the API's start cost ~60 ms
        of CPU, and on two cores that much beside a running job delays its result by as much
        (measured: 577 vs 512 ms to a cell's value, median of 10). A `gpulayer run` of a short
        job never serves at all; a long one serves within a second. A second process finding
        the lock waits for the address meanwhile (``home.live_owner``).
        """
        events = self.cp.event_log
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SERVE_SOON_WITHIN
        cursor = events.cursor()
        while (left := deadline - loop.time()) > 0:
            page = await events.page(cursor=cursor, wait=left)
            cursor = page.cursor
            if any(e.job is not None and e.job.state.terminal for e in page.events):
                break
        await asyncio.to_thread(_import_api)
        try:
            await self._start_api(opts)
        except Exception as exc:  # the control plane works without it; say why
            log.error("could not serve the API for other terminals: %s", exc)
            self.lock.publish({})  # nobody should wait for an address that will not come

    async def _start_api(self, opts: ServeOptions) -> None:
        from .api import ApiServer
        from .security import TokenKind, TokenService, server_context

        ssl_ctx = server_context(opts.tls_cert, opts.tls_key or "") if opts.tls_cert else None
        tokens = await TokenService(self.store, users=self.cp.users).load()
        self.tokens = tokens
        # A crashed predecessor's published token must not outlive it.
        await tokens.revoke_where(
            lambda r: r.kind == TokenKind.CLIENT and r.name == LOCAL_TOKEN_NAME
        )
        rec, secret = await tokens.create(TokenKind.CLIENT, name=LOCAL_TOKEN_NAME)
        self._local_token = rec.id
        self.api = ApiServer(self.cp, tokens, ssl_context=ssl_ctx, limits=opts.limits)
        self.url = await self.api.start(opts.host, opts.port)
        info: dict[str, Any] = {"url": self.url, "token": secret}
        if opts.tls_cert:
            info["ca_cert"] = str(Path(opts.ca_cert or opts.tls_cert).resolve())
        self.lock.publish(info)
        config = self._providers_config
        if config is not None and config.autoscale.enabled and config.providers:
            await self.cp.provisioning.autoscale(tokens, ",".join(opts.urls) or self.url)

    async def stop(self) -> None:
        background, self._background = self._background, []
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self.api is not None:
            await self.api.stop()
            self.api = None
        if self.tokens is not None and self._local_token is not None:
            with contextlib.suppress(Exception):
                await self.tokens.revoke(self._local_token)
            self._local_token = None
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
        await self.cp.close()
        await self.store.close()
        self.lock.release()

    async def __aenter__(self) -> Embedded:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
