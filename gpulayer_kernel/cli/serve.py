"""``gpulayer serve``: the control plane over HTTP (/api/v1), optionally with a local worker.

Heavy imports (tornado, the embedded host) happen inside the handler so ``gpulayer jobs`` stays
quick to start.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import Handler, setup_logging, until_signalled

READY = "gpulayer serve: ready"


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


async def cmd_serve(args: argparse.Namespace) -> int:
    from ..api import ApiLimits
    from ..embedded import Embedded, ServeOptions
    from ..security import TokenKind

    setup_logging()
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
        pause_gc=True,
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
        await until_signalled()
    finally:
        await emb.stop()
    return 0


COMMANDS: dict[str, Handler] = {"serve": cmd_serve}
