"""``gpulayer worker``: a worker agent that joins a served control plane over HTTP.

Heavy imports (the agent, its HTTP transport, the GPU probe) happen inside the handler so
``gpulayer jobs`` stays quick to start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..contracts import parse_pairs
from ..errors import Forbidden, InvalidInput, Unauthorized, Unavailable
from .common import Handler, setup_logging, stop_signal

JOIN_TOKEN_ENV = "GPULAYER_JOIN_TOKEN"
JOINED = "gpulayer worker: joined"

log = logging.getLogger("gpulayer.cli")


def add_parsers(sub: Any) -> None:
    """Add worker to the ``gpulayer`` sub-parsers."""
    worker = sub.add_parser("worker", help="run a worker that joins a served control plane")
    worker.add_argument(
        "--server",
        default=os.environ.get("GPULAYER_URL"),
        metavar="URL",
        help="the control plane, e.g. https://gpu-head:8470; several, comma-separated, for an "
        "active one and its standby ($GPULAYER_URL)",
    )
    worker.add_argument(
        "--join-token",
        "--instance-token",
        dest="join_token",
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
        "--shared-path",
        action="append",
        default=[],
        metavar="HERE[=THERE]",
        help="a folder Jupyter hosts share with this worker (e.g. /home/alice=/mnt/home/alice): "
        "notebooks under it run in place, nothing copied (repeatable; docs/workspace.md)",
    )
    worker.add_argument(
        "--host-id",
        default=None,
        metavar="ID",
        help="what this machine is called for workspaces (default: /etc/machine-id); a Jupyter "
        "host with the same id runs its notebooks here in place",
    )
    worker.add_argument(
        "--ca-cert",
        default=None,
        help="CA that signed the server's certificate ($GPULAYER_CA_CERT)",
    )
    worker.add_argument(
        "--no-tunnel",
        action="store_true",
        help="send every request over HTTP, never on the worker tunnel (a WebSocket the worker "
        "opens to the control plane for its small requests; it falls back to HTTP on its own)",
    )
    worker.add_argument(
        "--check",
        action="store_true",
        help="only check that the server answers and accepts the join token (enrols nothing, "
        "spends no instance token), then exit",
    )


def _labels(text: str) -> dict[str, str]:
    """``--labels zone=a,team=vision`` -> ``{"zone": "a", "team": "vision"}``."""
    return parse_pairs(filter(None, (p.strip() for p in text.split(","))), "--labels")


async def cmd_worker(args: argparse.Namespace) -> int:
    from ..capabilities.local import local_capabilities
    from ..contracts import WorkerRegistration, parse
    from ..embedded import follow_probe
    from ..home import home_dir
    from ..security import check_url
    from ..worker.agent import WorkerAgent
    from ..worker.backoff import backoff
    from ..worker.config import ExecutorConfig
    from ..worker.http import HttpTransport
    from ..worker.workspace import shares_from

    setup_logging()
    if not args.server:
        raise InvalidInput("no server given", hint="pass --server URL or set GPULAYER_URL")
    for url in args.server.split(","):
        check_url(url.strip())
    token = args.join_token or os.environ.get(JOIN_TOKEN_ENV, "")
    if not token:
        raise InvalidInput(
            "no join token given",
            hint=f"set {JOIN_TOKEN_ENV} (or pass --join-token); create one on the server with "
            "`gpulayer token create --kind join`",
        )
    if args.check:
        return await _check(args.server, token, args.ca_cert)
    name = args.name or socket.gethostname().split(".")[0] or "worker"
    probed = await local_capabilities(args.simulate_gpus, args.simulate_kind)
    caps = probed.capabilities
    reg = parse(
        WorkerRegistration,
        {
            "name": name,
            "labels": _labels(args.labels),
            "capabilities": caps.model_dump(),
            "address": args.advertise_addr,
            "transport": "http",
            "shares": shares_from(args.shared_path, host=args.host_id).model_dump(),
        },
    )
    work = Path(args.work_dir) if args.work_dir else home_dir() / f"worker-{name}"
    work.mkdir(parents=True, exist_ok=True)
    transport = HttpTransport(args.server, token, ca_cert=args.ca_cert, tunnel=not args.no_tunnel)
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
    waiter = stop_signal()
    print(
        f"{JOINED} {args.server} as {info.name} (id {info.id}, {len(caps.devices)} GPU(s){sim})",
        flush=True,
    )
    # The full probe, when it runs in the background, re-registers this worker when it answers.
    confirming = asyncio.ensure_future(follow_probe(agent, probed))
    try:
        loops = asyncio.ensure_future(agent.wait())
        await asyncio.wait({waiter, loops}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        confirming.cancel()
        await agent.stop()
    if agent.fatal is not None:  # a failure retrying cannot mend: said, not looped on
        print(f"gpulayer worker: stopped: {agent.fatal}", file=sys.stderr, flush=True)
        return 1
    print("gpulayer worker: left the control plane", flush=True)
    return 0


async def _check(server: str, token: str, ca_cert: str | None) -> int:
    """``gpulayer worker --check``: one request, and what the server said about the token."""
    from .. import __version__
    from ..worker.http import HttpTransport

    transport = HttpTransport(server, token, ca_cert=ca_cert, retry_for=0)
    try:
        check = await transport.check_join()
    finally:
        await transport.close()
    expires = check.get("expires_at")
    until = "never expires" if expires is None else f"expires at {time.ctime(expires)}"
    print(
        f"gpulayer worker: {server} (gpulayer {check['version']}) accepts this {check['kind']} "
        f"token {check['token_id']} ({until}); this machine has gpulayer {__version__}",
        flush=True,
    )
    return 0


COMMANDS: dict[str, Handler] = {"worker": cmd_worker}
