"""The embedded default: a ControlPlane on SQLite under ``$GPULAYER_HOME`` and a local worker.

No server to start: ``gpulayer run``, plain IPython and tests open one of these in-process. It
takes the state directory's lock for as long as it lives. With ``serve=ServeOptions(...)`` it also
serves the HTTP API (127.0.0.1, a random port by default) and publishes its address and a fresh
client token in the lock file (mode 0600), so a ``gpulayer jobs`` in another terminal connects to
it instead of failing on the lock (DESIGN rule 3); ``gpulayer serve`` is this with a fixed port.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .contracts import WorkerCapabilities, WorkerRegistration
from .controlplane import ControlPlane
from .errors import InvalidInput
from .home import Layout, StateLock, home_dir
from .security.vault import key_source
from .store import LocalArtifactStore, open_store
from .worker.agent import WorkerAgent
from .worker.config import ExecutorConfig
from .worker.transport import InProcessTransport

if TYPE_CHECKING:
    from .api import ApiLimits, ApiServer
    from .providers import ProvidersConfig
    from .security import TokenService

SIMULATE_ENV = "GPULAYER_SIMULATE_GPUS"
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


SIMULATE_KIND_ENV = "GPULAYER_SIMULATE_KIND"


PROBE_CACHE_TTL = 24 * 3600.0


def _probe_key() -> str:
    """What the probe's answer depends on: the interpreter, torch's install, the GPU driver."""
    parts = [sys.executable, sys.version]
    spec = importlib.util.find_spec("torch")  # finds the package without importing it (~2 s)
    if spec is not None and spec.origin:
        parts.append(f"torch@{os.stat(spec.origin).st_mtime_ns}")
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/driver/nvidia/version").read_text())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


async def local_capabilities(
    simulate_gpus: int | None = None,
    simulate_kind: str | None = None,
    cache: Path | None = None,
) -> WorkerCapabilities:
    """This machine's capabilities: simulated GPUs when asked, else the isolated probe's.

    The probe imports torch in a subprocess (~2.5 s here), so its answer is cached in ``cache``
    for a day, keyed by interpreter, torch install and driver version.
    """
    from . import capabilities

    if simulate_gpus is None and os.environ.get(SIMULATE_ENV):
        try:
            simulate_gpus = int(os.environ[SIMULATE_ENV])
        except ValueError:
            raise InvalidInput(
                f"{SIMULATE_ENV}={os.environ[SIMULATE_ENV]!r} is not a number",
                hint=f"set {SIMULATE_ENV} to how many simulated GPUs the local worker has",
            ) from None
    simulate_kind = simulate_kind or os.environ.get(SIMULATE_KIND_ENV) or "a100-80gb"
    if simulate_gpus:
        return capabilities.simulated_capabilities(simulate_gpus, simulate_kind)
    key = _probe_key()
    if cache is not None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(cache.read_text())
            if data["key"] == key and time.time() - data["time"] < PROBE_CACHE_TTL:
                return WorkerCapabilities.model_validate(data["capabilities"])
    caps = await capabilities.run_probe()
    # A failed probe run ("probe: timed out …") is not cached: the next start tries again.
    if cache is not None and not any(e.startswith("probe:") for e in caps.probe_errors):
        with contextlib.suppress(OSError):
            cache.write_text(
                json.dumps(
                    {"key": key, "time": time.time(), "capabilities": caps.model_dump(mode="json")}
                )
            )
    return caps


class Embedded:
    """ControlPlane + stores + (optionally) an in-process local worker, as one context."""

    def __init__(
        self,
        home: str | Path | None = None,
        *,
        local_worker: bool = True,
        simulate_gpus: int | None = None,
        simulate_kind: str | None = None,
        heartbeat_timeout: float = 30.0,
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
        self.layout = Layout(home_dir(home))
        self.lock = StateLock(self.layout)
        self.store = open_store(db or f"sqlite://{self.layout.db}")
        self.cp = ControlPlane(
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
        self._serve = ServeOptions() if serve is True else serve or None
        self.tokens: TokenService | None = None
        self.api: ApiServer | None = None
        self.url: str | None = None
        self._local_token: str | None = None

    async def start(self) -> Embedded:
        if self._serve is not None:
            from .security import check_serve

            check_serve(self._serve.host, self._serve.tls_cert, self._serve.tls_key)
        self.lock.acquire()
        try:
            await self.store.open()
            await self.cp.start()
            config = self._providers()
            if self._serve is not None:
                await self._start_api(self._serve)
                if config is not None and config.autoscale.enabled and config.providers:
                    assert self.tokens is not None and self.url is not None
                    await self.cp.provisioning.autoscale(self.tokens, self.url)
            if self._want_worker:
                caps = await local_capabilities(
                    *self._simulate, cache=self.layout.root / "probe.json"
                )
                self.worker = WorkerAgent(
                    InProcessTransport(self.cp),
                    WorkerRegistration(name=self._worker_name, capabilities=caps),
                    ExecutorConfig(work_root=self.layout.work),
                    clock=self.cp.clock,
                    heartbeat_interval=max(0.5, self.cp.heartbeat_timeout / 3),
                )
                await self.worker.start()
        except BaseException:
            await self.stop()
            raise
        return self

    def _providers(self) -> ProvidersConfig | None:
        """Read the providers config (if any) and hand it to the control plane."""
        from . import providers

        config = providers.load(providers.config_path(self.layout.root))
        if config is not None:
            built = providers.build(config, home=self.layout.root, clock=self.cp.clock)
            self.cp.provisioning.use(config, built)
        return config

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

    async def stop(self) -> None:
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
