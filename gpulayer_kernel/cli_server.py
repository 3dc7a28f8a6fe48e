"""``gpulayer serve``, ``gpulayer worker``, ``gpulayer token …`` and ``gpulayer secret …``.

``add_commands(subparsers)`` adds the parsers; ``COMMANDS`` maps each command to its async
handler (``cli.main`` looks it up beside its own). Heavy imports (tornado, the agent) happen inside
the handlers so ``gpulayer jobs`` stays quick to start.

Token and secret commands talk to the live control plane when there is one (``GPULAYER_URL``, or
the lock file of ``$GPULAYER_HOME``), else they open the state directory directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from .errors import Forbidden, GPUlayerError, InvalidInput, Unauthorized, Unavailable

JOIN_TOKEN_ENV = "GPULAYER_JOIN_TOKEN"
READY = "gpulayer serve: ready"
JOINED = "gpulayer worker: joined"

log = logging.getLogger("gpulayer.cli")


def add_commands(sub: Any) -> None:
    """Add serve, worker, token and secret to the ``gpulayer`` sub-parsers."""
    serve = sub.add_parser("serve", help="serve the control plane over HTTP (/api/v1)")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; others need --tls-cert)",
    )
    serve.add_argument("--port", type=int, default=8470, help="port (default 8470; 0: any)")
    serve.add_argument("--tls-cert", default=None, help="certificate (PEM) to serve HTTPS")
    serve.add_argument("--tls-key", default=None, help="its private key (PEM)")
    serve.add_argument(
        "--ca-cert",
        default=None,
        help="CA that local commands should trust (default: the certificate)",
    )
    serve.add_argument("--home", default=None, help="state directory (default $GPULAYER_HOME)")
    serve.add_argument(
        "--local-worker", action="store_true", help="also run a worker in this process"
    )
    serve.add_argument(
        "--simulate-gpus",
        type=int,
        default=None,
        metavar="N",
        help="the local worker advertises N simulated GPUs",
    )
    serve.add_argument("--simulate-kind", default=None, metavar="KIND")
    serve.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="declare a worker lost after this long without news (default 30)",
    )
    serve.add_argument(
        "--max-wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the longest long-poll the server holds (default 60)",
    )

    worker = sub.add_parser("worker", help="run a worker that joins a served control plane")
    worker.add_argument(
        "--server",
        default=os.environ.get("GPULAYER_URL"),
        metavar="URL",
        help="the control plane, e.g. https://gpu-head:8470 ($GPULAYER_URL)",
    )
    worker.add_argument(
        "--join-token",
        default=None,
        metavar="TOKEN",
        help=f"join or instance token (better: ${JOIN_TOKEN_ENV}, which ps does not show)",
    )
    worker.add_argument("--name", default=None, help="worker name (default: the host name)")
    worker.add_argument("--labels", default="", metavar="K=V,...", help="labels for selectors")
    worker.add_argument("--simulate-gpus", type=int, default=None, metavar="N")
    worker.add_argument(
        "--simulate-kind", default=None, metavar="KIND", help="e.g. a100-80gb (default)"
    )
    worker.add_argument(
        "--advertise-addr",
        default=None,
        metavar="IP",
        help="address other workers reach this one at (multi-node gangs)",
    )
    worker.add_argument("--work-dir", default=None, help="where jobs run (default under home)")
    worker.add_argument(
        "--ca-cert",
        default=None,
        help="CA that signed the server's certificate ($GPULAYER_CA_CERT)",
    )

    token = sub.add_parser("token", help="create, list and revoke tokens")
    tsub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = tsub.add_parser("create", help="create a token (shown once)")
    create.add_argument("--kind", choices=["client", "join", "instance"], default="client")
    create.add_argument("--ttl", default=None, help="lifetime: 90 (s), 30m, 1h, 7d (default never)")
    create.add_argument("--name", default="", help="a note to recognise it by")
    tlist = tsub.add_parser("list", help="list tokens (never their secrets)")
    tlist.add_argument("--all", action="store_true", help="also revoked, expired and used ones")
    revoke = tsub.add_parser("revoke", help="revoke a token; it stops working at once")
    revoke.add_argument("id", help="the token's id (the part after glt_x_)")

    secret = sub.add_parser("secret", help="store secrets that jobs reference by name")
    ssub = secret.add_subparsers(dest="secret_command", required=True, metavar="ACTION")
    sset = ssub.add_parser("set", help="set NAME from stdin (or a hidden prompt)")
    sset.add_argument("name")
    ssub.add_parser("list", help="list secret names (values are never shown)")
    sdel = ssub.add_parser("delete", help="delete a secret")
    sdel.add_argument("name")


def _setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("GPULAYER_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if logging.getLogger().level > logging.DEBUG:
        # One line per request is noise at INFO: the access log speaks up for refusals and
        # errors only (GPULAYER_LOG_LEVEL=DEBUG shows every request, never with query strings).
        logging.getLogger("gpulayer.access").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


# -- serve -------------------------------------------------------------------------------------


async def cmd_serve(args: argparse.Namespace) -> int:
    from .api import ApiLimits
    from .embedded import Embedded, ServeOptions
    from .security import TokenKind

    _setup_logging()
    opts = ServeOptions(
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        ca_cert=args.ca_cert,
        limits=ApiLimits(max_wait=args.max_wait),
    )
    emb = Embedded(
        args.home,
        local_worker=args.local_worker,
        simulate_gpus=args.simulate_gpus,
        simulate_kind=args.simulate_kind,
        heartbeat_timeout=args.heartbeat_timeout,
        serve=opts,
    )
    await emb.start()
    try:
        assert emb.tokens is not None and emb.url is not None
        if not any(
            r.kind == TokenKind.CLIENT and r.name == "admin"
            for r in emb.tokens.list(include_inactive=True)
        ):
            _, secret = await emb.tokens.create(TokenKind.CLIENT, name="admin")
            # Printed once, to the terminal that started the server; never logged.
            print(
                f"gpulayer serve: admin client token (shown once, store it now): {secret}",
                flush=True,
            )
            print(
                "gpulayer serve: create join tokens for workers with: "
                "gpulayer token create --kind join --ttl 1h",
                flush=True,
            )
        print(
            f"{READY} on {emb.url}/api/v1 (home {emb.layout.root}, heartbeat timeout "
            f"{args.heartbeat_timeout:g}s)",
            flush=True,
        )
        await _until_signalled()
    finally:
        await emb.stop()
    return 0


# -- worker ------------------------------------------------------------------------------------


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(
                f"--labels item {item!r} is not key=value", hint="write --labels zone=a,team=vision"
            )
        out[key] = value
    return out


async def cmd_worker(args: argparse.Namespace) -> int:
    from .contracts import WorkerRegistration, parse
    from .embedded import local_capabilities
    from .home import home_dir
    from .security import check_url
    from .worker.agent import WorkerAgent, backoff
    from .worker.executor import ExecutorConfig
    from .worker.http import HttpTransport

    _setup_logging()
    if not args.server:
        raise InvalidInput("no server given", hint="pass --server URL or set GPULAYER_URL")
    check_url(args.server)
    token = args.join_token or os.environ.get(JOIN_TOKEN_ENV, "")
    if not token:
        raise InvalidInput(
            "no join token given",
            hint=f"set {JOIN_TOKEN_ENV} (or pass --join-token); create one on the server with "
            "`gpulayer token create --kind join`",
        )
    name = args.name or socket.gethostname().split(".")[0] or "worker"
    caps = await local_capabilities(
        args.simulate_gpus, args.simulate_kind, cache=home_dir() / "probe.json"
    )
    reg = parse(
        WorkerRegistration,
        {
            "name": name,
            "labels": _labels(args.labels),
            "capabilities": caps.model_dump(),
            "address": args.advertise_addr,
            "transport": "http",
        },
    )
    work = Path(args.work_dir) if args.work_dir else home_dir() / f"worker-{name}"
    work.mkdir(parents=True, exist_ok=True)
    transport = HttpTransport(args.server, token, ca_cert=args.ca_cert)
    agent = WorkerAgent(
        transport,
        reg,
        ExecutorConfig(work_root=work, advertise_addr=args.advertise_addr or "127.0.0.1"),
    )
    attempt = 0
    while True:
        try:
            info = await agent.start()
            break
        except (Unauthorized, Forbidden):
            await transport.close()
            raise
        except Unavailable as exc:
            delay = backoff(attempt)
            attempt += 1
            log.warning("cannot join yet (%s); retrying in %.1fs", exc.message, delay)
            await asyncio.sleep(delay)
    # The server says how often it wants to hear from us and how long it holds a poll.
    agent.heartbeat_interval = transport.heartbeat_interval or agent.heartbeat_interval
    agent.poll_wait = min(agent.poll_wait, transport.max_wait)
    sim = " (simulated GPUs)" if caps.simulated else ""
    print(
        f"{JOINED} {args.server} as {info.name} (id {info.id}, {len(caps.devices)} GPU(s){sim})",
        flush=True,
    )
    try:
        waiter = asyncio.ensure_future(_until_signalled())
        loops = asyncio.ensure_future(agent.wait())
        await asyncio.wait({waiter, loops}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    finally:
        await agent.stop()
    print("gpulayer worker: left the control plane", flush=True)
    return 0


# -- tokens and secrets ------------------------------------------------------------------------


class Admin(Protocol):
    async def create_token(
        self, kind: str, *, ttl: float | None = None, name: str = ""
    ) -> tuple[dict[str, Any], str]: ...
    async def list_tokens(self, *, include_inactive: bool = False) -> list[dict[str, Any]]: ...
    async def revoke_token(self, token_id: str) -> dict[str, Any]: ...
    async def set_secret(self, name: str, value: str) -> None: ...
    async def secret_names(self) -> list[str]: ...
    async def delete_secret(self, name: str) -> bool: ...


class LocalAdmin:
    """The admin calls against a state directory opened here (no server is running)."""

    def __init__(self, cp: Any, tokens: Any) -> None:
        self.cp = cp
        self.tokens = tokens

    def _info(self, rec: Any) -> dict[str, Any]:
        from .api.handlers import token_info

        return token_info(rec, time.time()).model_dump(mode="json")

    async def create_token(
        self, kind: str, *, ttl: float | None = None, name: str = ""
    ) -> tuple[dict[str, Any], str]:
        if kind not in ("client", "join", "instance"):
            raise InvalidInput(
                f"cannot create a {kind} token", hint="worker session tokens are issued by joining"
            )
        rec, secret = await self.tokens.create(kind, ttl=ttl, name=name)
        return self._info(rec), secret

    async def list_tokens(self, *, include_inactive: bool = False) -> list[dict[str, Any]]:
        return [self._info(r) for r in self.tokens.list(include_inactive=include_inactive)]

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._info(await self.tokens.revoke(token_id))

    async def set_secret(self, name: str, value: str) -> None:
        await self.cp.set_secret(name, value)

    async def secret_names(self) -> list[str]:
        return list(await self.cp.secret_names())

    async def delete_secret(self, name: str) -> bool:
        return bool(await self.cp.delete_secret(name))


@contextlib.asynccontextmanager
async def admin_session() -> AsyncIterator[Admin]:
    from .session import _remote

    remote = _remote()
    if remote is not None:
        from .client import AsyncClient

        async with AsyncClient(remote[0], remote[1]) as client:
            yield client
        return
    from .embedded import Embedded
    from .security import TokenService

    async with Embedded(local_worker=False) as emb:
        yield LocalAdmin(emb.cp, await TokenService(emb.store).load())


def _when(t: float | None) -> str:
    if t is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


async def cmd_token(args: argparse.Namespace) -> int:
    from .security import parse_ttl

    async with admin_session() as admin:
        if args.token_command == "create":
            info, secret = await admin.create_token(
                args.kind, ttl=parse_ttl(args.ttl), name=args.name
            )
            print(secret)
            print(
                f"gpulayer: {info['kind']} token {info['id']} created, expires "
                f"{_when(info['expires_at'])}; it is shown only this once",
                file=sys.stderr,
            )
            return 0
        if args.token_command == "list":
            tokens = await admin.list_tokens(include_inactive=args.all)
            print(f"{'ID':<14}{'KIND':<10}{'STATE':<9}{'CREATED':<18}{'EXPIRES':<18}NAME")
            for t in tokens:
                note = t["name"] + (f" (worker {t['worker_id']})" if t["worker_id"] else "")
                print(
                    f"{t['id']:<14}{t['kind']:<10}{t['state']:<9}{_when(t['created_at']):<18}"
                    f"{_when(t['expires_at']):<18}{note}"
                )
            return 0
        info = await admin.revoke_token(args.id)
        print(f"token {info['id']} ({info['kind']}): {info['state']}")
        return 0


def _read_secret(name: str) -> str:
    if sys.stdin.isatty():
        value = getpass.getpass(f"value of {name} (not echoed): ")
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value
    if not value:
        raise InvalidInput(
            f"no value given for {name}",
            hint=f'pipe it in: printf %s "$VALUE" | gpulayer secret set {name}',
        )
    return value


async def cmd_secret(args: argparse.Namespace) -> int:
    if args.secret_command == "set":
        value = _read_secret(args.name)  # before connecting: a prompt must not hold a connection
        async with admin_session() as admin:
            await admin.set_secret(args.name, value)
        print(f"secret {args.name} set; jobs use it with --secret {args.name}", file=sys.stderr)
        return 0
    async with admin_session() as admin:
        if args.secret_command == "list":
            for name in await admin.secret_names():
                print(name)
            return 0
        if not await admin.delete_secret(args.name):
            raise GPUlayerError(
                f"no secret {args.name!r}", hint="list them with `gpulayer secret list`"
            )
        print(f"secret {args.name} deleted", file=sys.stderr)
        return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "serve": cmd_serve,
    "worker": cmd_worker,
    "token": cmd_token,
    "secret": cmd_secret,
}
