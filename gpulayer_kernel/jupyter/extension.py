"""The Jupyter server extension: the control plane lives inside the Jupyter server.

Enabled on install (``jupyter-config/server-config/gpulayer.json``), it opens the embedded
ControlPlane (SQLite under ``$GPULAYER_HOME``) on the server's event loop, runs the local worker,
and serves the API (docs/api-routes.md) under ``{base_url}gpulayer/api/v1/``:

- user routes on jupyter_server's ``APIHandler``: Jupyter's own login (token or cookie, XSRF on
  state-changing browser requests); this is what the Lab panel calls;
- worker routes on GPUlayer worker tokens only, so a remote ``gpulayer worker`` can join a control
  plane that lives in JupyterLab.

Kernels and terminals started by this server find the control plane through ``GPULAYER_URL`` and
``GPULAYER_TOKEN``, set in the server's environment before they start: a loopback-only listener
(``127.0.0.1``, random port) that speaks GPUlayer client tokens exactly like ``gpulayer serve``,
and a client token made for them at start and revoked at stop. The same address and token are
published in the state directory's lock file (mode 0600), so ``gpulayer`` commands run elsewhere
on this machine connect to it too. ADR 0018 ("Server extension") says why.

Who is asking: a user route's caller is the person jupyter_server's ``IdentityProvider`` signed
in (``current_user.username``), so under JupyterHub each person is themselves. Their role is the
one stored for that name (``gpulayer user``) when there is one; else ``admin`` for the server's
owner (``$JUPYTERHUB_USER``, or anyone listed in ``c.GPUlayer.admin_users``), ``user`` for anyone
else under JupyterHub (a shared server), and ``c.GPUlayer.default_role`` (``admin``: the single
user of a laptop's Jupyter) otherwise. The kernels' token belongs to the owner.

When ``GPULAYER_URL`` is already set as Jupyter starts (a served ``gpulayer serve``, with
``GPULAYER_TOKEN``), the kernels use that control plane and the extension hosts none: it forwards
the panel's routes there with that token (``proxy.py``), so the panel, the kernels' waiting
notice and the sidebar badge show the control plane the kernels use.

When the state directory is owned by another process (or the control plane cannot start), the
Jupyter server keeps running: the error is logged once and every GPUlayer route answers 503 with
its message and hint. Configure with ``c.GPUlayer.home``, ``c.GPUlayer.local_worker``,
``c.GPUlayer.simulate_gpus`` and ``c.GPUlayer.heartbeat_timeout``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int, List, Unicode

from ..api import ApiServer, HandlerSpec, make_context, op_of, user_handlers, worker_handlers
from ..client.connect import TOKEN_ENV, URL_ENV
from ..contracts import ADMIN_USER
from ..contracts.limits import HEARTBEAT_TIMEOUT
from ..embedded import Embedded
from ..errors import GPUlayerError, Unavailable
from ..home import HOME_ENV
from ..kernels.host import local_plane
from ..security import Identity, Role, TokenKind, TokenService
from .pending import forget_failed_starts, settle_restarts
from .proxy import Upstream, proxy_handlers

log = logging.getLogger("gpulayer.jupyter")

#: Where the API is mounted, under the Jupyter server's base_url.
API_PREFIX = "/gpulayer/api/v1"
#: The name of the client token made for this server's kernels (old ones are revoked at start).
KERNEL_TOKEN_NAME = "jupyter-server kernels"
#: The web application setting under which handlers find the running host.
HOST_SETTING = "gpulayer_host"


class ControlPlaneHost:
    """The control plane of one Jupyter server: its life, its routes' gate, its kernels' env."""

    def __init__(
        self,
        *,
        home: str | None,
        local_worker: bool,
        simulate_gpus: int,
        heartbeat_timeout: float,
        logger: logging.Logger | None = None,
        default_role: str = "admin",
        admin_users: tuple[str, ...] = (),
    ) -> None:
        self.log = logger or log
        self.owner = os.environ.get("JUPYTERHUB_USER") or None
        self.admins = {*admin_users, *([self.owner] if self.owner else [])}
        # Under JupyterHub a person other than the owner uses a shared server: a user by default.
        self.default_role = Role.USER if self.owner else Role(default_role)
        self.state = "starting"
        self.error: GPUlayerError | None = None
        self.embedded = Embedded(
            home,
            local_worker=local_worker,
            simulate_gpus=simulate_gpus or None,
            heartbeat_timeout=heartbeat_timeout,
            pause_gc=True,
        )
        self.tokens = TokenService(self.embedded.store, users=self.embedded.cp.users)
        self.context = make_context(self.embedded.cp, self.tokens)
        self.loopback: ApiServer | None = None
        self._published = ""  # the loopback URL kernels of this process reach in-process
        self.kernel_token_id: str | None = None
        self._saved_env: dict[str, str | None] = {}
        # GPULAYER_URL set before Jupyter started: its kernels use that control plane, and the
        # panel's routes are forwarded there (``proxy.py``) rather than hosted here.
        preset = os.environ.get(URL_ENV)
        self.upstream = Upstream(preset, os.environ.get(TOKEN_ENV, "")) if preset else None
        if preset:
            self.state = "forwarding"

    # -- routes ----------------------------------------------------------------------------------

    def handlers(self) -> list[HandlerSpec]:
        """The user routes (Jupyter auth) and worker routes (worker tokens), both gated; or,
        forwarding, the route that passes the panel's calls on."""
        if self.upstream is not None:
            return proxy_handlers(API_PREFIX, self.upstream)
        cp, tokens, ctx = self.embedded.cp, self.tokens, self.context
        user = [
            (pattern, _wrapped(cls, tornado.web.authenticated), kwargs)
            for pattern, cls, kwargs in user_handlers(
                JupyterUserHandler, API_PREFIX, cp, tokens, context=ctx
            )
        ]
        workers = [
            (
                pattern,
                _wrapped(type(cls.__name__, (WorkerGate, cls), {}), allow_unauthenticated),
                kwargs,
            )
            for pattern, cls, kwargs in worker_handlers(API_PREFIX, cp, tokens, context=ctx)
        ]
        return [*user, *workers]

    def check(self, *, detailed: bool) -> None:
        """Raise the 503 a route answers while the control plane is not serving."""
        if self.state == "ready":
            return
        if self.state == "starting":
            raise Unavailable(
                "the GPUlayer control plane of this Jupyter server is starting",
                hint="retry in a moment (the Lab panel does this on its own)",
                code="starting",
            )
        if self.state == "stopped":
            raise Unavailable(
                "the server is shutting down",
                hint="retry in a moment (clients and workers do this on their own)",
                code="shutting_down",
            )
        if detailed and self.error is not None:
            raise self.error
        # Worker routes answer before any authentication: say what, not where or whose.
        raise Unavailable(
            "the GPUlayer control plane of this Jupyter server is not running",
            hint="its owner can read why in the Jupyter server's log",
            code="not_running",
        )

    # -- life ------------------------------------------------------------------------------------

    async def start(self, *, jupyter_url: str = "") -> None:
        """Open the control plane and its worker, the loopback listener, and the kernels' env."""
        if self.upstream is not None:
            self.log.info(
                "GPUlayer: %s is set: the kernels use the control plane at %s, and the panel's "
                "API under %s is forwarded there",
                URL_ENV,
                self.upstream.url,
                API_PREFIX,
            )
            return
        if self.state != "starting":
            if self.error is not None:
                self.log.error("GPUlayer: %s (hint: %s)", self.error.message, self.error.hint)
            return
        try:
            await self.embedded.start()
            await self.tokens.load()
            # One client token per running server; earlier servers' (crashed, never revoked)
            # tokens are revoked here: only the owner of this state directory can be running.
            await self.tokens.revoke_where(
                lambda r: r.kind == TokenKind.CLIENT and r.name == KERNEL_TOKEN_NAME
            )
            owner = self.owner or ADMIN_USER
            if self.embedded.cp.users.find(owner) is None:
                await self.embedded.cp.users.add(owner, Role.ADMIN)
            rec, secret = await self.tokens.create(
                TokenKind.CLIENT, name=KERNEL_TOKEN_NAME, owner=owner
            )
            self.kernel_token_id = rec.id
            self.loopback = ApiServer(self.embedded.cp, self.tokens)
            url = await self.loopback.start("127.0.0.1", 0)
            self.embedded.lock.publish({"url": url, "token": secret, "jupyter": jupyter_url})
            # This process's GPU kernels reach it in-process (one thread hop, no HTTP).
            local_plane(url, self.embedded.cp, Identity(owner, Role.ADMIN))
            self._published = url
            self._set_env(
                {URL_ENV: url, TOKEN_ENV: secret, HOME_ENV: str(self.embedded.layout.root)}
            )
        except Exception as exc:
            await self._abort_start()
            self.state = "failed"
            if isinstance(exc, GPUlayerError):
                self.error = exc
            else:
                self.log.exception("GPUlayer: the control plane could not start")
                self.error = Unavailable(
                    f"the GPUlayer control plane could not start: {type(exc).__name__}: {exc}",
                    hint="the Jupyter server's log has the details",
                    code="start_failed",
                )
            self.log.error("GPUlayer: %s (hint: %s)", self.error.message, self.error.hint)
            return
        self.state = "ready"
        worker = self.embedded.worker
        self.log.info(
            "GPUlayer control plane in %s is up: API under %s, kernels use %s%s",
            self.embedded.layout.root,
            API_PREFIX,
            url,
            f", local worker {worker.registration.name}" if worker is not None else "",
        )

    async def _abort_start(self) -> None:
        with contextlib.suppress(Exception):
            if self.loopback is not None:
                await self.loopback.stop()
        self.loopback = None
        self._restore_env()
        # Embedded.start cleans up after itself when it fails; this covers later steps.
        with contextlib.suppress(Exception):
            await self.embedded.stop()

    async def stop(self) -> None:
        """End long-polls, close the listener, stop the local worker, release the state dir."""
        was = self.state
        self.state = "stopped"
        if self.upstream is not None:
            await self.upstream.close()
        if was != "ready":
            return
        await self.context.drain()
        if self._published:
            local_plane(self._published, None)
        if self.loopback is not None:
            await self.loopback.stop()
            self.loopback = None
        self._restore_env()
        if self.kernel_token_id is not None:
            with contextlib.suppress(GPUlayerError):
                await self.tokens.revoke(self.kernel_token_id)
        await self.embedded.stop()
        self.log.info("GPUlayer control plane in %s stopped", self.embedded.layout.root)

    def identity(self, user: Any) -> Identity:
        """The GPUlayer identity of a person jupyter_server signed in."""
        name = str(getattr(user, "username", "") or "anonymous")
        default = Role.ADMIN if name in self.admins else self.default_role
        return self.embedded.cp.users.identity_named(name, default)

    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, old in self._saved_env.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        self._saved_env.clear()


def _host_of(handler: tornado.web.RequestHandler) -> ControlPlaneHost:
    host = handler.settings.get(HOST_SETTING)
    if not isinstance(host, ControlPlaneHost):  # pragma: no cover - mounted without a host
        raise Unavailable("the GPUlayer server extension is not loaded", code="not_running")
    return host


# A refusal raised in ``prepare`` is answered before the request body is read; tornado then
# closes the connection with the body unread, and the client often sees "connection reset"
# instead of the 401/403/503 (measured: most POSTs with a body, here). So a refusal of a request
# with a small body is kept and raised when the handler method runs, after the body was read.
DEFER_BODY_MAX = 1 << 20


def _defer(handler: tornado.web.RequestHandler, exc: Exception) -> None:
    length = handler.request.headers.get("Content-Length", "")
    if not (length.isdigit() and 0 < int(length) <= DEFER_BODY_MAX):
        raise exc
    handler._gl_refused = exc  # type: ignore[attr-defined]


Method = Callable[..., Any]


def _refuse_first(method: Method) -> Method:
    """Raise the refusal ``prepare`` kept (see ``_defer``) instead of running ``method``."""

    @functools.wraps(method)
    def checked(self: tornado.web.RequestHandler, *args: Any, **kwargs: Any) -> Any:
        refused: Exception | None = getattr(self, "_gl_refused", None)
        if refused is not None:
            raise refused
        return method(self, *args, **kwargs)

    return checked


def _wrapped(
    cls: type[tornado.web.RequestHandler], outer: Callable[[Method], Method]
) -> type[tornado.web.RequestHandler]:
    """A subclass whose methods raise a kept refusal first, wrapped in ``outer``.

    ``outer`` tells Jupyter how each method authenticates: ``tornado.web.authenticated`` for user
    routes (Jupyter's login), ``allow_unauthenticated`` for worker routes (GPUlayer worker
    tokens, checked by the route itself), so Jupyter does not warn about either.
    """
    methods = {
        name: outer(_refuse_first(method))
        for name in ("get", "head", "post", "put", "delete", "patch")
        if op_of(method := getattr(cls, name)) is not None
    }
    return type(cls.__name__, (cls,), {"__module__": __name__, **methods})


class JupyterUserHandler(APIHandler):
    """Base of the user routes inside Jupyter: Jupyter's auth first, then the host's state."""

    gl_who: Identity | None = None

    async def prepare(self) -> None:  # type: ignore[override]  # as APIHandler's own
        try:
            await super().prepare()
            if self._finished:
                return
            if not self.current_user:
                # As ``@authenticated`` would, but before the 503 below can say anything.
                raise tornado.web.HTTPError(403)
            host = _host_of(self)
            host.check(detailed=True)
            self.gl_who = host.identity(self.current_user)
        except (tornado.web.HTTPError, GPUlayerError) as exc:
            _defer(self, exc)


class WorkerGate(tornado.web.RequestHandler):
    """Put before a worker route: 503 while the control plane is not serving."""

    async def prepare(self) -> None:
        try:
            _host_of(self).check(detailed=False)
            result = super().prepare()
            if result is not None:
                await result
        except (tornado.web.HTTPError, GPUlayerError) as exc:
            _defer(self, exc)


class GPUlayer(ExtensionApp):
    """GPUlayer inside a Jupyter server (``c.GPUlayer.*`` configures it)."""

    name = "gpulayer"
    description = "GPUlayer control plane, local worker and API inside this Jupyter server"
    load_other_extensions = True

    home = Unicode(
        None,
        allow_none=True,
        config=True,
        help="GPUlayer state directory (default: $GPULAYER_HOME, else ~/.gpulayer)",
    )
    local_worker = Bool(
        True, config=True, help="Run a worker for this machine inside the Jupyter server."
    )
    simulate_gpus = Int(
        0,
        config=True,
        help="Simulated GPUs for the local worker; 0 honours GPULAYER_SIMULATE_GPUS, else the "
        "probe decides.",
    )
    heartbeat_timeout = Float(
        HEARTBEAT_TIMEOUT,
        config=True,
        help="Seconds without a heartbeat before a worker is declared lost.",
    )
    default_role = Unicode(
        "admin",
        config=True,
        help="Role of a signed-in person who is not a GPUlayer user here (admin, user, viewer); "
        "under JupyterHub, people other than the server's owner are users.",
    )
    admin_users = List(
        Unicode(), config=True, help="Jupyter user names that are GPUlayer admins here."
    )

    host: ControlPlaneHost | None = None

    def initialize_settings(self) -> None:
        self.host = ControlPlaneHost(
            home=self.home,
            local_worker=self.local_worker,
            simulate_gpus=self.simulate_gpus,
            heartbeat_timeout=self.heartbeat_timeout,
            logger=self.log,
            default_role=self.default_role,
            admin_users=tuple(self.admin_users),
        )
        self.settings[HOST_SETTING] = self.host

    def initialize_handlers(self) -> None:
        assert self.host is not None
        self.handlers.extend(self.host.handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.host is not None:
            await self.host.start(jupyter_url=str(getattr(serverapp, "connection_url", "")))

    async def stop_extension(self) -> None:
        # Jupyter stops extensions before it shuts its kernels down: the last chance to keep
        # that shutdown from failing on a kernel being restarted, or whose start failed.
        kernels = getattr(self.serverapp, "kernel_manager", None)
        await settle_restarts(kernels, self.log)
        if self.host is not None:
            await self.host.stop()
        forget_failed_starts(kernels, self.log)
