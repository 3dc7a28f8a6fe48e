"""``gpulayer serve``: the control plane over HTTP (/api/v1), optionally with a local worker.

On SQLite (the default, in the home) it serves at once. On PostgreSQL (``--db postgresql://…``)
it first takes the leadership (``ha/leadership.py``): while another ``gpulayer serve`` leads
that database it is a standby (``ha/standby.py``: every request answered 503 ``not_leader``, naming
the leader), and it takes over on the same port the moment the leader is gone. A leader that
finds it lost the leadership (paused past its lease) steps down before writing and exits with
status 3, for its supervisor to start it again (as a standby).

The first start on a database makes the admin user and prints its token once.

Heavy imports (tornado, the embedded host) happen inside the handler so ``gpulayer jobs`` stays
quick to start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any

from ..contracts.limits import HEARTBEAT_TIMEOUT
from .common import Handler, setup_logging, stop_signal

READY = "gpulayer serve: ready"
STANDBY = "gpulayer serve: standby"
LOST = 3  # the exit status of a leader that stepped down


def add_parsers(sub: Any) -> None:
    """Add serve to the ``gpulayer`` sub-parsers."""
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
        default=HEARTBEAT_TIMEOUT,
        metavar="SECONDS",
        help=f"declare a worker lost after this long without news (default {HEARTBEAT_TIMEOUT:g})",
    )
    serve.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="metadata store: sqlite:///path (default: in the home) or postgresql://USER@HOST/DB "
        "(then several serve processes may share it: one leads, the others stand by)",
    )
    serve.add_argument(
        "--artifacts",
        default=None,
        metavar="DIR",
        help="blob folder (default: in the home); an active and a standby share one",
    )
    serve.add_argument(
        "--secrets-key",
        default=None,
        metavar="FILE",
        help="key file sealing secrets (default: $GPULAYER_SECRETS_KEY, "
        "$GPULAYER_SECRETS_KEY_COMMAND, else secrets.key in the home)",
    )
    serve.add_argument(
        "--key-check-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a standby checks that its secrets key opens every stored secret this often "
        "(default 5)",
    )
    serve.add_argument(
        "--advertise-url",
        default=None,
        metavar="URL",
        help="the URL clients reach this server at (standbys name the leader by it)",
    )
    serve.add_argument(
        "--cluster-urls",
        default=None,
        metavar="URL1,URL2",
        help="every control plane of this cluster (the active and its standbys): workers the "
        "autoscaler launches are given them all, to follow a failover (default: "
        "--advertise-url, else this server's URL)",
    )
    serve.set_defaults(loop_factory=serve_loop)
    serve.add_argument(
        "--max-wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the longest long-poll the server holds (default 60)",
    )


def serve_loop() -> asyncio.AbstractEventLoop:
    """The server's event loop: uvloop's where it is installed (issue 25, measured with
    ``benchmarks/bench_http.py``), else asyncio's own; ``GPULAYER_LOOP=asyncio`` asks for
    asyncio's even where uvloop is installed. Imported only when serving."""
    if os.environ.get("GPULAYER_LOOP", "").strip().lower() != "asyncio":
        try:
            import uvloop
        except ImportError:  # an optional speed-up: asyncio's loop serves the same
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def cmd_serve(args: argparse.Namespace) -> int:
    from ..api import ApiLimits
    from ..embedded import ServeOptions
    from ..security import check_serve

    setup_logging()
    check_serve(args.host, args.tls_cert, args.tls_key)
    opts = ServeOptions(
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        ca_cert=args.ca_cert,
        limits=ApiLimits(max_wait=args.max_wait),
        urls=_cluster_urls(args),
    )
    if args.db and args.db.split("://", 1)[0].lower() in ("postgresql", "postgres"):
        return await _serve_leading(args, opts)
    return await _serve(args, opts, None)


def _cluster_urls(args: argparse.Namespace) -> tuple[str, ...]:
    """The URLs launched workers dial (``--cluster-urls``, else ``--advertise-url``)."""
    from ..ha.failover import split_urls

    given = args.cluster_urls or args.advertise_url
    return tuple(split_urls(given)) if given else ()


async def _serve_leading(args: argparse.Namespace, opts: Any) -> int:
    """Stand by until this process leads the database, then serve on the same port."""
    from dataclasses import replace

    from ..ha.leadership import Leadership
    from ..ha.standby import (
        KeyWatch,
        StandbyServer,
        forget_standby,
        lead_when_ready,
        publish_keys,
        sealing_keys,
    )
    from ..home import home_dir
    from ..security import server_context
    from ..security.vault import key_source

    ssl_ctx = server_context(opts.tls_cert, opts.tls_key or "") if opts.tls_cert else None
    # The key is checked before standing by: a standby that could not open the secrets would
    # take over only to exit, a total outage (issue 24).
    source = key_source(home_dir(args.home), args.secrets_key)
    watch = KeyWatch(source, lambda: sealing_keys(args.db), max(0.1, args.key_check_interval))
    problem = await watch.check()
    if problem is not None:
        problem.message = f"refusing to stand by: {problem.message}"
        raise problem
    leadership = Leadership(args.db, "")
    standby = StandbyServer(leadership, watch)
    url = await standby.start(opts.host, opts.port, ssl_ctx)
    leadership.advertise = args.advertise_url or url
    # Every check says which keys this standby holds (its /health and the leader's reseal).
    watch.publish = lambda held, problem: publish_keys(args.db, leadership.advertise, held, problem)
    await watch.check()
    signalled = stop_signal()
    print(f"{STANDBY} on {url}/api/v1 (leader: {await leadership.leader_url()})", flush=True)
    # A degraded standby (a stale key) does not compete: it would take over only to exit.
    acquiring = asyncio.ensure_future(lead_when_ready(leadership, watch))
    either: set[asyncio.Future[Any]] = {acquiring, signalled}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    await standby.stop()
    if not acquiring.done():
        acquiring.cancel()
        await leadership.release()
        return 0
    signalled.cancel()
    acquiring.result()
    with contextlib.suppress(Exception):  # a stale row only lingers STANDBY_STALE seconds
        await forget_standby(args.db, leadership.advertise)
    try:
        return await _serve(args, replace(opts, port=standby.port), leadership)
    finally:
        await leadership.release()


async def _serve(args: argparse.Namespace, opts: Any, leadership: Any) -> int:
    from ..embedded import Embedded
    from ..security import TokenKind

    emb = Embedded(
        args.home,
        local_worker=args.local_worker,
        simulate_gpus=args.simulate_gpus,
        simulate_kind=args.simulate_kind,
        heartbeat_timeout=args.heartbeat_timeout,
        serve=opts,
        pause_gc=True,
        db=args.db,
        artifacts=args.artifacts,
        secrets_key=args.secrets_key,
    )
    if leadership is not None:
        emb.store.fence = leadership.fence  # type: ignore[attr-defined]  # a PostgresStore
    await emb.start()
    if leadership is not None:
        from ..ha.standby import standby_keys

        # A re-seal is refused while a live standby lacks the key (security/rotation.py).
        emb.cp.secrets.standbys = lambda: standby_keys(args.db, exclude=leadership.advertise)
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
                "gpulayer serve: add people with `gpulayer user add NAME` and give them tokens "
                "with `gpulayer token create --user NAME`; workers join with "
                "`gpulayer token create --kind join --ttl 1h`",
                flush=True,
            )
        stop = stop_signal()
        print(
            f"{READY} on {emb.url}/api/v1 (home {emb.layout.root}, heartbeat timeout "
            f"{args.heartbeat_timeout:g}s)",
            flush=True,
        )
        waits = {stop}
        if leadership is not None:
            waits.add(asyncio.ensure_future(leadership.lost.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if leadership is not None and leadership.lost.is_set():
            print("gpulayer serve: lost the leadership; stepping down", flush=True)
            return LOST
    finally:
        await emb.stop()
    return 0


COMMANDS: dict[str, Handler] = {"serve": cmd_serve}
