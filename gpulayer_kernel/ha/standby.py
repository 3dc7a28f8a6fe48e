"""A standby ``gpulayer serve`` on PostgreSQL: answer "not the leader, ask there" until it leads.

While another process leads (``ha/leadership.py``), a standby listens on its own address and
answers every request with 503 ``not_leader``, naming the leader's URL (``details.leader``) and a
``Retry-After``, so clients and workers given several URLs move to the leader at once; nothing
is written here. When the leader goes, ``Leadership.acquire`` returns: the standby stops this
listener and starts the real control plane on the same port (``cli/serve.py``), loading the live
state from the database, handing placed work out again and opening a new event epoch.

Two routes answer otherwise: ``GET /api/v1/health`` (liveness) answers 200 with ``role:
standby``, so a container healthcheck does not restart a healthy standby, and ``/api/v1/ready``
answers 503 ``not_leader`` like the rest, so a load balancer sends nothing here.

A standby must be able to take over, so it checks its secrets key before it is needed
(``KeyWatch``): ``gpulayer serve`` refuses to stand by when its key source cannot open every key
that seals a secret in the database, and the watch checks again every few seconds, reading only
the key ids (no value leaves the database). A rotation by the leader changes those ids: the
standby re-reads its key file and, if it lacks the new key, says so in its log (an error) and in
its /health answer (``status: degraded``, ``problem``), while the old leader still serves.

Each check also records in the database which key ids this standby holds (``gl_standby``, beside
the leadership table, outside the fenced state): /health shows them on every server (``keys``),
and the leader refuses to re-seal with a key a live standby lacks (``security/rotation.py``), so
the ``add`` step of a rotation is checked before it matters. A *degraded* standby does not
compete for the leadership (``lead_when_ready``): it withdraws its lock request until its keys
are right again, so a leader's death never hands the database to a server that would only exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from .. import __version__
from ..api.app import _url_host
from ..errors import GPUlayerError, SecretsKeyError, Unavailable
from ..security.vault import KeySource, key_id, missing_keys
from ..store.postgres import CONNECT_TIMEOUT, _asyncpg
from ..store.urls import shown
from .failover import LEADER_HEADER, ROLE_HEADER
from .leadership import Leadership

log = logging.getLogger("gpulayer.standby")
access_log = logging.getLogger("gpulayer.access")

LEADER_CACHE = 1.0  # seconds a looked-up leader URL is reused
KEY_CHECK_EVERY = 5.0  # seconds between two key checks: one small query on the database
# A key *command* (a KMS) runs again this often, or when the database's key ids change; a key
# file or variable is re-read on every check (a stat and a small read).
KEY_COMMAND_EVERY = 60.0
LOUD_EVERY = 60.0  # a problem still there is logged again this often

STANDBY_STALE = 60.0  # seconds after its last check a standby's keys stop counting
_STANDBY_TABLE = (
    "CREATE TABLE IF NOT EXISTS gl_standby (url TEXT PRIMARY KEY, keys TEXT NOT NULL, "
    "problem TEXT, seen_at DOUBLE PRECISION NOT NULL)"
)

Sealing = Callable[[], Awaitable[dict[str, int]]]
Publish = Callable[[list[str], "SecretsKeyError | None"], Awaitable[None]]


async def _connect(url: str, what: str) -> Any:
    asyncpg = _asyncpg()
    try:
        return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT)
    except Exception as exc:
        raise Unavailable(
            f"cannot reach the database {shown(url)} to {what}: {exc}",
            hint="check the --db URL and that PostgreSQL is running",
            code="store_unavailable",
        ) from None


async def publish_keys(
    url: str, advertise: str, held: list[str], problem: SecretsKeyError | None
) -> None:
    """Record which key ids the standby at ``advertise`` holds (and its problem), now."""
    con = await _connect(url, "record this standby's keys")
    try:
        await con.execute(_STANDBY_TABLE)
        await con.execute(
            "INSERT INTO gl_standby (url, keys, problem, seen_at) "
            "VALUES ($1, $2, $3, extract(epoch from now())) ON CONFLICT (url) DO UPDATE SET "
            "keys = excluded.keys, problem = excluded.problem, seen_at = excluded.seen_at",
            advertise,
            ",".join(held),
            problem.message if problem else None,
        )
    finally:
        await con.close()


async def standby_keys(url: str, *, exclude: str = "") -> dict[str, list[str]]:
    """The key ids each standby checked in the last ``STANDBY_STALE`` seconds holds (the
    database's clock), by URL; ``exclude``: this server's own (a standby that now leads)."""
    con = await _connect(url, "read the standbys' keys")
    try:
        await con.execute(_STANDBY_TABLE)
        rows = await con.fetch(
            "SELECT url, keys FROM gl_standby WHERE seen_at > extract(epoch from now()) - $1",
            STANDBY_STALE,
        )
    finally:
        await con.close()
    return {
        str(r["url"]): [k for k in str(r["keys"]).split(",") if k]
        for r in rows
        if r["url"] != exclude
    }


async def forget_standby(url: str, advertise: str) -> None:
    """This server leads now: its row as a standby goes."""
    con = await _connect(url, "record this server's role")
    try:
        await con.execute(_STANDBY_TABLE)
        await con.execute("DELETE FROM gl_standby WHERE url = $1", advertise)
    finally:
        await con.close()


async def sealing_keys(url: str) -> dict[str, int]:
    """Per key id, how many stored secrets it seals; the ids are cut out by the database, so no
    sealed value crosses the wire. Empty before the leader made the tables."""
    asyncpg = _asyncpg()
    try:
        con = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT)
    except Exception as exc:
        raise Unavailable(
            f"cannot reach the database {shown(url)} to check the secrets keys: {exc}",
            hint="check the --db URL and that PostgreSQL is running",
            code="store_unavailable",
        ) from None
    try:
        rows = await con.fetch(
            "SELECT split_part(value, ':', 2) AS kid, count(*) AS n FROM user_secrets "
            "WHERE value LIKE 'gv1:%' GROUP BY 1"
        )
    except asyncpg.UndefinedTableError:
        return {}
    finally:
        await con.close()
    return {str(r["kid"]): int(r["n"]) for r in rows}


class KeyWatch:
    """Whether this standby's key source opens every key sealing a secret in the database."""

    def __init__(
        self,
        source: KeySource,
        sealing: Sealing,
        every: float = KEY_CHECK_EVERY,
        publish: Publish | None = None,
    ):
        self.source = source
        self.sealing = sealing
        self.every = every
        self.publish = publish  # where each check says which keys this standby holds
        self.problem: SecretsKeyError | None = None
        self.held: list[str] = []  # the ids of the keys the source holds, as last read
        self.healthy = asyncio.Event()  # set while the keys open every sealed secret
        self.degraded = asyncio.Event()  # set while they do not
        self._ids: dict[str, int] | None = None
        self._keys: list[bytes] | None = None
        self._unreadable: SecretsKeyError | None = None  # the last read's failure
        self._read_at = 0.0
        self._logged_at = 0.0

    async def check(self) -> SecretsKeyError | None:
        """Check now (re-reading the source when it may have changed); the problem, or None."""
        ids = await self.sealing()
        now = time.monotonic()
        if (
            self.source.kind != "command"
            or ids != self._ids
            or now - self._read_at > KEY_COMMAND_EVERY
        ):
            try:
                self._keys, self._unreadable = self.source.read(create=False), None
            except SecretsKeyError as exc:  # garbled, or the command failed
                self._keys, self._unreadable = None, exc
            self._read_at = now
        self._ids = ids
        self.held = [key_id(k) for k in self._keys or []]
        self._report(self._unreadable or self._judge(ids, self._keys))
        if self.publish is not None:
            await self.publish(self.held, self.problem)
        return self.problem

    def _judge(self, ids: dict[str, int], keys: list[bytes] | None) -> SecretsKeyError | None:
        where = self.source.describe()
        if keys is None:
            if not ids:
                return None  # nothing sealed yet: the leader's key file is made on first use
            return SecretsKeyError(
                f"{where} is missing, and the database holds {sum(ids.values())} secret(s) "
                f"sealed with key {', '.join(sorted(ids))}: this standby could not take over",
                hint="copy the key file from the leader (mode 0600) to this path, or point "
                "--secrets-key (or $GPULAYER_SECRETS_KEY) at it",
                details={"source": self.source.where, "missing": sorted(ids)},
            )
        missing = missing_keys(keys, ids)
        if not missing:
            return None
        held = [key_id(k) for k in keys]
        return SecretsKeyError(
            f"{where} cannot open key {', '.join(missing)}, which seals "
            f"{sum(ids[k] for k in missing)} secret(s) in the database (it holds "
            f"{', '.join(held) or 'no key'}): this standby could not take over",
            hint="copy the leader's key file here again (after `gpulayer secret rotate-key` "
            "it says which file); this standby re-reads it within seconds",
            details={"source": self.source.where, "missing": missing, "held": held},
        )

    def _report(self, problem: SecretsKeyError | None) -> None:
        """Log a change at once, and a problem still there every ``LOUD_EVERY`` seconds."""
        now = time.monotonic()
        before, self.problem = self.problem, problem
        (self.degraded if problem else self.healthy).set()
        (self.healthy if problem else self.degraded).clear()
        if problem is None:
            if before is not None:
                log.info("standby: secrets keys ok again: %s opens every key", self.source.where)
            return
        if (
            before is None
            or before.message != problem.message
            or now - self._logged_at > LOUD_EVERY
        ):
            self._logged_at = now
            log.error("standby: %s (%s)", problem.message, problem.hint)

    async def run(self) -> None:
        """Check every ``every`` seconds until cancelled; the database away is no key problem."""
        while True:
            await asyncio.sleep(self.every)  # a timer, not a hot path
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the last answer stands
                log.warning("standby: cannot check the secrets keys now: %s", exc)


class NotLeaderHandler(tornado.web.RequestHandler):
    """Every route of a standby: 503 ``not_leader`` with the leader's URL."""

    def initialize(self, standby: StandbyServer) -> None:
        self.standby = standby

    def set_default_headers(self) -> None:
        self.set_header(ROLE_HEADER, "standby")  # HEAD answers too, which carry no body

    async def _answer(self, *args: Any) -> None:
        leader = await self.standby.leader()
        if leader:
            self.set_header(LEADER_HEADER, leader)
        self.set_status(503)
        self.set_header("Content-Type", "application/json")
        self.set_header("Retry-After", "1")
        self.set_header("Cache-Control", "no-store")
        body = {
            "code": "not_leader",
            "message": "this control plane is a standby"
            + (f"; the leader is {leader}" if leader else ""),
            "hint": "send requests to the leader: give clients and workers every URL "
            "(GPULAYER_URL=URL1,URL2; --server URL1,URL2) and they move on their own",
            "details": {"leader": leader, "retry_after": 1},
        }
        self.finish(json.dumps(body))

    get = head = post = put = delete = patch = _answer

    def check_xsrf_cookie(self) -> None:
        """Nothing is done here: no request to forge."""


class StandbyHealthHandler(tornado.web.RequestHandler):
    """``GET /api/v1/health`` on a standby: alive, ``role: standby``, and any key problem."""

    def initialize(self, standby: StandbyServer) -> None:
        self.standby = standby

    def set_default_headers(self) -> None:
        self.set_header(ROLE_HEADER, "standby")

    def get(self) -> None:
        problem = self.standby.watch.problem if self.standby.watch else None
        body: dict[str, Any] = {
            "api_version": "gpulayer/v1",
            "status": "degraded" if problem else "ok",
            "version": __version__,
            "role": "standby",
            "problem": _problem(problem) if problem else None,
            "keys": self.standby.watch.held if self.standby.watch else [],
        }
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    head = get


def _log_request(handler: tornado.web.RequestHandler) -> None:
    """A standby's access log: its 503 ``not_leader`` is its normal answer (every scrape and
    readiness probe gets one), logged at INFO, never as an error (tornado logs 5xx so)."""
    access_log.info(
        "%d %s %s (standby) %.1fms",
        handler.get_status(),
        handler.request.method,
        handler.request.path,
        1000.0 * handler.request.request_time(),
    )


def _problem(exc: GPUlayerError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "hint": exc.hint}


class StandbyServer:
    """The listener of a standby; ``port`` is kept for the control plane that follows."""

    def __init__(self, leadership: Leadership, watch: KeyWatch | None = None) -> None:
        self.leadership = leadership
        self.watch = watch
        self._watching: asyncio.Task[None] | None = None
        self._server: tornado.httpserver.HTTPServer | None = None
        self._leader: tuple[float, str | None] = (0.0, None)
        self.port = 0
        self.url = ""

    async def leader(self) -> str | None:
        at, url = self._leader
        if time.monotonic() - at > LEADER_CACHE:
            try:
                url = await self.leadership.leader_url()
            except Exception:  # the database away: say no more than "not here"
                url = None
            self._leader = (time.monotonic(), url)
        return url

    async def start(self, host: str, port: int, ssl_options: Any = None) -> str:
        app = tornado.web.Application(
            [
                (r"/api/v1/health/?", StandbyHealthHandler, {"standby": self}),
                (r".*", NotLeaderHandler, {"standby": self}),  # /api/v1/ready among them
            ],
            log_function=_log_request,
        )
        sockets = tornado.netutil.bind_sockets(port, host or None, family=socket.AF_UNSPEC)
        self._server = tornado.httpserver.HTTPServer(app, ssl_options=ssl_options)
        self._server.add_sockets(sockets)
        self.port = int(sockets[0].getsockname()[1])
        scheme = "https" if ssl_options else "http"
        self.url = f"{scheme}://{_url_host(host)}:{self.port}"
        if self.watch is not None:
            self._watching = asyncio.ensure_future(self.watch.run())
        return self.url

    async def stop(self) -> None:
        if self._watching is not None:
            task, self._watching = self._watching, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()
            await server.close_all_connections()


async def lead_when_ready(leadership: Leadership, watch: KeyWatch | None) -> int:
    """Compete for the leadership only while this standby's keys are right; the epoch once it
    leads with keys that open every secret.

    A degraded standby (a stale or missing key) withdraws its lock request (its connection is
    closed, so PostgreSQL forgets it) and asks again once the keys are right: a leader's death
    then goes to a standby that can serve, or waits for one. A lock granted in the moment the
    keys went stale is handed back after a fresh check.
    """
    while True:
        if watch is not None and not watch.healthy.is_set():
            log.error(
                "standby: not competing for the leadership while its secrets key is wrong: %s",
                watch.problem.message if watch.problem else "not checked yet",
            )
            await watch.healthy.wait()
            log.info("standby: secrets keys ok: competing for the leadership again")
        acquiring = asyncio.ensure_future(leadership.acquire())
        waits: set[asyncio.Future[Any]] = {acquiring}
        if watch is not None:
            waits.add(asyncio.ensure_future(watch.degraded.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits - {acquiring}:
                w.cancel()
        if not acquiring.done():
            acquiring.cancel()  # degraded: withdraw (acquire closes its connection)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await acquiring
            continue
        epoch = acquiring.result()
        if watch is None or await watch.check() is None:
            return epoch
        log.error("took the leadership with a secrets key that is wrong now; handing it back")
        await leadership.release()
