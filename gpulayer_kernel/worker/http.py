"""The worker protocol over HTTP (ADR 0003): the same WorkerAgent/JobExecutor, another transport.

Errors map onto what the agent already knows how to handle:

* the server unreachable, restarting, or answering 502/503/504 → ``Unavailable`` (status 503):
  the agent backs off and retries; calls the executor makes mid-job (``report_started``, logs,
  blobs, rendezvous) are retried here first for a while, so a control-plane restart does not
  fail a running job;
* 401 → ``Unauthorized``: the agent re-joins; ``register`` first tries the worker's own session
  token (it keeps its id and gets a new session), then the join token;
* 403 → ``Forbidden``, 404 → ``NotFound``, 409 → ``Conflict``: the job is not (or no longer) ours;
  409 ``stale_attempt`` says the attempt a report names is no longer current (stop it, drop it).

Every report about a job names its attempt: in the body (logs, progress, finish, rendezvous) or
as ``?attempt=`` (started, which has no body); none named means "the current one".

Several server URLs (``--server URL1,URL2``: an active control plane and its standby) fail over
as ``ha/failover.py`` says; the session token stays valid on whichever becomes leader (tokens live
in the shared database), and a 401 there re-joins as above.

Long-polls ask the server for at most its ``max_wait`` and give the HTTP request that much plus a
margin, so the server always answers first and no assignment is lost in a client timeout.

Protocol 1.1 (when the server says so at join: ``JoinAnswer.protocol``; every request says
``GPUlayer-Protocol: 1.1``, and a server of another major version is refused naming both): the
worker's reports go in batches (``POST /worker/reports``), small bundles come inline with their
work (so ``fetch_blob`` needs no request), and calls whose answer it never reads ask for
``Prefer: return=minimal`` (204, no body). Against a 1.0 server it speaks 1.0.
Retry deadlines, backoffs and long-poll deadlines run on the transport's
:class:`~gpulayer_kernel.clock.Clock`; only httpx's own socket timeouts are real seconds.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx

from .. import versions
from ..client.calls import ENROLMENT, Req
from ..clock import SYSTEM_CLOCK, Clock
from ..codes import ErrorCode
from ..contracts import (
    CellReport,
    FinishReport,
    JobReport,
    LogLine,
    Rendezvous,
    ReportAnswer,
    SessionReport,
    Work,
    WorkerInfo,
    WorkerRegistration,
)
from ..contracts.limits import LINE_PIECE, MAX_BODY, MAX_LINES
from ..errors import (
    Conflict,
    GPUlayerError,
    Unauthorized,
    Unavailable,
    ValidationFailed,
    from_json,
)
from ..ha.failover import Servers
from ..wire.http import Wire
from .backoff import backoff
from .fitting import ENVELOPE, fit_lines, line_json, runs, utf8_len
from .transport import KernelLink, Transport

log = logging.getLogger("gpulayer.worker")
T = TypeVar("T")

RETRYABLE_STATUS = (502, 503, 504)
INLINE_KEPT = 64  # bundles that came with work, kept until their job asks


class HttpTransport(Transport):
    """Talks to ``/api/v1`` with a join token (to enrol) and then its session token."""

    def __init__(
        self,
        server: str,
        join_token: str,
        *,
        ca_cert: str | None = None,
        timeout: float = 30.0,
        retry_for: float = 120.0,
        clock: Clock = SYSTEM_CLOCK,
        tunnel: bool = False,
    ) -> None:
        """``tunnel``: its small requests on the worker tunnel where the server has one
        (``wire/tunnel.py``; ``gpulayer worker`` uses it unless told ``--no-tunnel``)."""
        self.server = server
        self.clock = clock
        self.join_token = join_token
        self.session_token: str | None = None
        # Sent with every join by join_token: an instance token's enrolment whose answer was
        # lost (its control plane killed, a failover) is this worker again when retried.
        self._enrolment = secrets.token_hex(16)
        # One join at a time: a re-join (the poll loop's, after a loss) and a re-registration
        # (the full probe's answer) racing would each start a session, and the later answer
        # could leave the worker holding the session the other one replaced (its heartbeats
        # refused until the next poll notices).
        self._joining = asyncio.Lock()
        self.retry_for = retry_for
        self.heartbeat_interval: float | None = None
        self.max_wait = 60.0
        self.ca_cert = ca_cert
        self.protocol: versions.Version = versions.OLDEST  # the server's, told at join
        # Bundles that came with work (base64 by digest), until the bundle cache asks for them.
        self._inline: OrderedDict[str, str] = OrderedDict()
        # GPUlayer's one HTTP client: failover, TLS, this worker's session token, errors.
        self.wire = Wire(
            server,
            lambda: self.session_token,
            ca_cert=ca_cert,
            timeout=timeout,
            clock=clock,
            tunnel="worker" if tunnel else None,
        )
        self.wire.pool()  # the first URL's pool now: a bad URL fails at once

    @property
    def servers(self) -> Servers:
        return self.wire.servers

    def kernel_link(self) -> KernelLink:
        from .http_kernel import HttpKernelLink  # most workers never run a GPU kernel

        return HttpKernelLink(self.wire)

    # -- plumbing --------------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: str | None = None,
        content: bytes | None = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        minimal: bool = False,
        repeatable: bool = False,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request on the wire (failover, TLS, errors); ``token``: its own credential (the
        join token); ``timeout``: a long-poll's or transfer's own; ``repeatable``: sending it
        twice does no harm (past a hung server in seconds, as a GET)."""
        req = Req(
            method,
            path,
            params=list((params or {}).items()),
            json=body,
            content=content,
            timeout=timeout,
            minimal=minimal,
            repeatable=repeatable,
            headers=headers or {},
        )
        return await self.wire.send(req, token=token)

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry while the server is unreachable or restarting, up to ``retry_for`` seconds."""
        deadline = self.clock.monotonic() + self.retry_for
        attempt = 0
        while True:
            try:
                return await fn()
            except Unavailable as exc:
                if self.clock.monotonic() >= deadline:
                    raise
                delay = backoff(attempt)
                attempt += 1
                log.info("%s: %s; retrying in %.1fs", what, exc.message, delay)
                await self.clock.sleep(delay)

    async def check_join(self) -> dict[str, Any]:
        """``GET /workers/join``: would the join token be accepted? Enrols nothing, spends no
        instance token (``gpulayer worker --check``; scripts/install-worker.sh asks it)."""
        resp = await self._request("GET", "/workers/join", token=self.join_token)
        answer: dict[str, Any] = resp.json()
        return answer

    # -- the Transport ---------------------------------------------------------------------------

    async def register(self, reg: WorkerRegistration) -> WorkerInfo:
        async with self._joining:
            return await self._register(reg)

    async def _register(self, reg: WorkerRegistration) -> WorkerInfo:
        body = reg.model_copy(update={"transport": "http"}).model_dump_json()
        params = {"worker_id": self.worker_id} if self.worker_id else None
        resp: httpx.Response | None = None
        if self.session_token:
            try:
                resp = await self._request(
                    "POST", "/workers/join", token=self.session_token, body=body
                )
            except Unauthorized:
                resp = None  # the session ended (revoked, or a new server): join afresh
        if resp is None:
            try:
                resp = await self._request(
                    "POST",
                    "/workers/join",
                    token=self.join_token,
                    body=body,
                    params=params,
                    headers={ENROLMENT: self._enrolment},
                )
            except ValidationFailed as exc:
                if reg.shares is None or not _refused_field(exc, "shares"):
                    raise
                # A control plane from before workspaces (ADR 0022) forbids the new field: join
                # it as a worker of then did; its sessions then sync rather than run in place.
                log.warning("%s takes no shared folders (an older control plane)", self.server)
                return await self._register(reg.model_copy(update={"shares": None}))
        data = resp.json()
        info = WorkerInfo.model_validate(data["worker"])
        self.session_token = str(data["session_token"])
        self.heartbeat_interval = float(data.get("heartbeat_interval") or 5.0)
        self.max_wait = float(data.get("max_wait") or 60.0)
        self.protocol = versions.peer(
            data.get("protocol"), peer_is=f"the control plane at {self.servers.url}"
        )
        self.worker_id = info.id
        return info

    async def heartbeat(self) -> None:
        # Harmless twice: moves past a hung leader in seconds, so the new one keeps this worker.
        await self._request("POST", "/worker/heartbeat", minimal=True, repeatable=True)

    async def next_work(self, wait: float) -> Work:
        wait = max(0.0, min(wait, self.max_wait))
        resp = await self._request(
            "GET", "/worker/work", params={"wait": f"{wait:.3f}"}, timeout=wait + 30.0
        )
        work = Work.model_validate_json(resp.content)
        self._inline.update(work.bundles)
        while len(self._inline) > INLINE_KEPT:  # bundles the cache already held are never asked
            self._inline.popitem(last=False)
        return work

    async def report_started(self, job_id: str, attempt: int | None = None) -> None:
        params = None if attempt is None else {"attempt": str(attempt)}
        await self._retrying(
            f"reporting job {job_id} started",
            lambda: self._request(
                "POST", f"/worker/jobs/{job_id}/started", params=params, minimal=True
            ),
        )

    async def append_logs(
        self, job_id: str, lines: list[LogLine], attempt: int | None = None
    ) -> None:
        named = "" if attempt is None else f'"attempt":{int(attempt)},'
        # Each request fits the server's limits (contracts/limits.py), measured as sent.
        jsons = [line_json(x) for x in fit_lines(lines)]
        for run in runs([utf8_len(j) + 1 for j in jsons], MAX_BODY - ENVELOPE, MAX_LINES):
            body = "{" + named + '"lines":[' + ",".join(jsons[run.start : run.stop]) + "]}"
            await self._retrying(
                f"sending logs of job {job_id}",
                lambda body=body: self._request(  # type: ignore[misc]
                    "POST", f"/worker/jobs/{job_id}/logs", body=body, minimal=True
                ),
            )

    async def report_progress(
        self, job_id: str, fields: dict[str, Any], attempt: int | None = None
    ) -> None:
        data: dict[str, Any] = {"fields": fields}
        if attempt is not None:
            data["attempt"] = attempt
        body = json.dumps(data, allow_nan=False)
        await self._request("POST", f"/worker/jobs/{job_id}/progress", body=body)

    async def report_finished(self, job_id: str, report: FinishReport) -> None:
        # Not retried here: the agent retries delivery until the control plane has the result.
        await self._request(
            "POST", f"/worker/jobs/{job_id}/finished", body=report.model_dump_json(), minimal=True
        )

    async def report(self, reports: Sequence[JobReport]) -> list[GPUlayerError | None]:
        """Protocol 1.1: one request for them all (a 1.0 server: one call per kind each)."""
        # The worker's reporter builds batches that fit (worker/reports.py); one that does not
        # (another caller's) goes part by part, each part's lines in requests that fit.
        bodies = [r.model_dump_json(exclude_none=True) for r in reports]
        size = sum(map(utf8_len, bodies)) + len(bodies) + ENVELOPE
        fits = size <= MAX_BODY and all(len(r.lines) <= MAX_LINES for r in reports)
        if not versions.at_least(self.protocol, 1) or not fits:
            return await super().report(reports)
        resp = await self._request(
            "POST", "/worker/reports", body='{"reports":[' + ",".join(bodies) + "]}"
        )
        outcomes: list[GPUlayerError | None] = [None] * len(reports)
        if resp.status_code == 204:
            return outcomes
        for r in ReportAnswer.model_validate_json(resp.content).refused:
            if 0 <= r.index < len(outcomes):
                body = {"code": r.code, "message": r.message, "hint": r.hint or ""}
                outcomes[r.index] = from_json(r.status, body)
        return outcomes

    async def report_cell(self, job_id: str, report: CellReport) -> None:
        # Not retried here: the session executor retries delivery until it is taken.
        body = report.model_dump_json(exclude_none=True)
        too_large = utf8_len(body) + ENVELOPE > MAX_BODY or len(report.lines) > MAX_LINES
        if report.lines and (too_large or any(len(x.text) > LINE_PIECE for x in report.lines)):
            # Large output goes first as log batches that fit the server's limits, in order.
            await self.append_logs(job_id, report.lines, report.attempt)
            body = report.model_copy(update={"lines": []}).model_dump_json(exclude_none=True)
        await self._request("POST", f"/worker/jobs/{job_id}/cell", body=body)

    async def report_session(self, job_id: str, report: SessionReport) -> None:
        await self._retrying(
            f"reporting session {job_id}",
            lambda: self._request(
                "POST", f"/worker/jobs/{job_id}/session", body=report.model_dump_json()
            ),
        )

    async def fetch_blob(self, digest: str) -> bytes:
        inline = self._inline.pop(digest, None)
        if inline is not None:  # it came with its work: verified by the bundle cache
            return base64.b64decode(inline)
        resp = await self._retrying(
            f"fetching bundle {digest[:12]}",
            lambda: self._request("GET", f"/worker/blobs/{digest}", timeout=600.0),
        )
        return resp.content

    async def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        await self._retrying(
            f"uploading artifact {digest[:12]}",
            lambda: self._request("PUT", f"/worker/blobs/{digest}", content=data, timeout=600.0),
        )
        return digest

    async def publish_rendezvous(self, job_id: str, rdzv: Rendezvous) -> None:
        await self._retrying(
            f"publishing the rendezvous of job {job_id}",
            lambda: self._request(
                "POST", f"/worker/jobs/{job_id}/rendezvous", body=rdzv.model_dump_json()
            ),
        )

    async def get_rendezvous(self, job_id: str, wait: float) -> Rendezvous:
        deadline = self.clock.monotonic() + max(0.0, wait)
        while True:
            chunk = max(0.0, min(deadline - self.clock.monotonic(), self.max_wait))
            try:
                resp = await self._retrying(
                    f"waiting for the rendezvous of job {job_id}",
                    lambda chunk=chunk: self._request(  # type: ignore[misc]
                        "GET",
                        f"/worker/jobs/{job_id}/rendezvous",
                        params={"wait": f"{chunk:.3f}"},
                        timeout=chunk + 30.0,
                    ),
                )
                return Rendezvous.model_validate_json(resp.content)
            except Conflict as exc:
                if exc.code != ErrorCode.RENDEZVOUS_PENDING or self.clock.monotonic() >= deadline:
                    raise

    async def deregister(self) -> None:
        if self.session_token:
            await self._request("POST", "/worker/leave")
            self.session_token = None

    async def close(self) -> None:
        await self.wire.aclose()


def _refused_field(exc: ValidationFailed, field: str) -> bool:
    """Whether a 422 names ``field`` as unknown (a server older than the field)."""
    errors = exc.details.get("errors") or []
    return any(isinstance(e, dict) and str(e.get("field", "")).startswith(field) for e in errors)
