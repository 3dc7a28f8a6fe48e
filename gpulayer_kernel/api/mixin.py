"""``GLMixin``: what every GPUlayer handler does around its ``@op`` method.

It refuses tokens in URLs, holds bodies to their limit as they stream in (a raw upload goes
to disk as it arrives: ``uploads.Upload``), parses the query and body the ``Op`` declares,
sends the answer contract, and turns any error into one JSON shape. Long-polls come from
``LongPollMixin``. Every answer says the protocol this server speaks (``GPUlayer-Protocol``);
the caller's is ``gl_protocol`` (1.0 when it sent none; another major is refused naming both,
``versions.py``), and an operation declared ``minimal`` answers 204 to ``Prefer:
return=minimal``.

The answer is serialised straight to bytes (``model_dump_json``: pydantic's own serialiser,
never through a dict), and a contract a handler built itself is never validated again.

It is written to compose with any tornado ``RequestHandler`` base, including jupyter_server's
``APIHandler``: it calls ``super().prepare()``, answers through ``self.finish``, and leaves XSRF
and user authentication to the base class.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.web
from pydantic import BaseModel

from .. import versions
from ..contracts import PROTOCOL, parse
from ..controlplane import ControlPlane
from ..controlplane.idempotency import Claim
from ..display import human_bytes
from ..errors import GPUlayerError, InvalidInput, TooLarge, Unauthorized, Unavailable
from ..ha.failover import ROLE_HEADER
from ..security import Identity, Principal, check_role
from . import idempotency
from .context import ApiContext
from .errors import error_answer, loggable_path
from .longpoll import ClientGone, LongPollMixin
from .ops import Handler, Op, op_of
from .uploads import Upload

log = logging.getLogger("gpulayer.api")


@tornado.web.stream_request_body
class GLMixin(LongPollMixin):
    """Shared behaviour of every GPUlayer handler; put it first in the bases."""

    route: str = ""  # e.g. "/jobs/{job_id}"; the factories turn it into a tornado pattern
    principal: Principal | None = None
    gl_who: Identity | None = None  # a user route's caller, set by the host's base class
    gl_protocol: versions.Version = versions.OLDEST  # what the caller and this mount both speak
    since: versions.Version = versions.OLDEST  # the protocol that added this route
    gl_exclude: set[str] | None = None  # fields of the answer this caller must not be sent
    gl_keyed = False  # runs under an Idempotency-Key (``idempotency.py``)
    # That key's claim, for the op to pass to the call that makes a job or a cell (ADR 0003).
    gl_claim: Claim | None = None

    def initialize(self, ctx: ApiContext) -> None:
        super().initialize(ctx)
        self._gl_serves = versions.parse(ctx.protocol)
        self.set_default_headers()  # again, now that the mount's protocol is known
        self._gl_chunks: list[bytes] = []
        self._gl_size = 0
        self._gl_limit = ctx.limits.max_json
        self._gl_raw = False  # a raw upload (``body="bytes"``), not JSON
        self._gl_upload: Upload | None = None
        # Decided while the body arrives (too large, no upload slot), answered once it is
        # read and dropped: a client still sending cannot read an answer sent before.
        self._gl_refused: GPUlayerError | None = None
        self._gl_counted = False

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header(ROLE_HEADER, "leader")  # a standby says "standby" (ha/standby.py)
        ctx = getattr(self, "ctx", None)
        if ctx is not None and ctx.protocol == "1.0":
            self.clear_header(versions.HEADER)  # a mount from before 1.1 said nothing
        else:
            self.set_header(versions.HEADER, PROTOCOL if ctx is None else ctx.protocol)

    @property
    def cp(self) -> ControlPlane:
        return self.ctx.cp

    @property
    def who(self) -> Identity:
        """The caller of a user route; a base that set none is refused (fails closed)."""
        if self.gl_who is None:
            raise Unauthorized(
                "this request carries no identity",
                hint="send a client token as 'Authorization: Bearer <token>'",
                code="no_identity",
            )
        return self.gl_who

    # -- request ---------------------------------------------------------------------------------

    def gl_op(self) -> Op | None:
        method = (self.request.method or "").lower()
        return op_of(getattr(self, method, None))

    async def prepare(self) -> None:
        self._gl_counted = True  # in flight until on_finish: the server's stop waits for it
        self.ctx.requests += 1
        said = self.request.headers.get(versions.HEADER)
        if said is not None and self._gl_serves > versions.OLDEST:
            self.gl_protocol = min(versions.peer(said, peer_is="the client"), self._gl_serves)
        for values in self.request.query_arguments.values():
            if any(v.startswith(b"glt_") for v in values):
                raise InvalidInput(
                    "tokens are never accepted in URLs (they would end up in logs)",
                    hint="send the token as the header 'Authorization: Bearer <token>', and "
                    "revoke this one: it may have been logged by a proxy",
                    code="token_in_url",
                )
        result = super().prepare()
        if result is not None:
            await result
        if self._finished or self.request.method == "OPTIONS":
            return
        spec = self.gl_op()
        if spec is None:
            raise tornado.web.HTTPError(405)
        limits = self.ctx.limits
        self._gl_raw = spec.body in ("bytes", "raw")
        if self._gl_raw:
            self._gl_limit = getattr(limits, spec.upload_limit)
        else:
            self._gl_limit = max(limits.max_json, spec.body_limit or 0)
        length = self.request.headers.get("Content-Length")
        declared = int(length) if length and length.isdigit() else None
        if declared is not None and declared > self._gl_limit:
            self._gl_refused = self._gl_too_large_error()
        elif spec.body == "bytes":
            try:
                self._gl_upload = Upload.open(self.ctx, self.cp.artifacts)
            except Unavailable as busy:
                self._gl_refused = busy
        if self._gl_refused is not None and declared is not None and declared > limits.drain_max:
            raise self._gl_refused  # answered now; the connection then closes unread
        connection = self.request.connection
        if connection is not None and hasattr(connection, "set_max_body_size"):
            # Without a Content-Length (chunked), read up to ``drain_max`` past the limit, so
            # an oversize body is counted, dropped and answered with 413 rather than cut off.
            most = self._gl_limit + limits.drain_max if declared is None else declared
            connection.set_max_body_size(max(self._gl_limit, most))

    async def data_received(self, chunk: bytes) -> None:
        """Keep (JSON) or stream to disk (uploads) a piece of the body; tornado awaits this
        before it reads the next piece."""
        if self._gl_refused is not None:
            return  # drained: read and dropped
        self._gl_size += len(chunk)
        if self._gl_size > self._gl_limit:
            # Refused the moment the body passes its limit: nothing more is kept or written.
            self._gl_refused = self._gl_too_large_error()
            self._gl_chunks.clear()
            self._gl_close_upload()
        elif self._gl_upload is not None:
            await self._gl_upload.write(chunk)
        else:
            self._gl_chunks.append(chunk)

    def _gl_too_large_error(self) -> TooLarge:
        upload = self._gl_raw
        what = "upload" if upload else "request body"
        return TooLarge(
            f"the {what} is over the {human_bytes(self._gl_limit)} limit",
            hint="ship large data on the worker's disk or as a job's output, not in a bundle"
            if upload
            else "large files travel as bundles or artifacts; large logs in several batches",
            details={"limit": self._gl_limit},
            code="body_too_large",
        )

    def _gl_close_upload(self) -> None:
        if self._gl_upload is not None:
            self._gl_upload.close()

    def on_finish(self) -> None:
        self._gl_close_upload()
        # Every answer, refusals (401, 413) included, timed per route template (a job id in
        # the label would make a series per job). A dict lookup and a bucket search.
        self.cp.metrics.request_done(
            self.route, self.request.method or "", self.get_status(), self.request.request_time()
        )
        if self._gl_counted:
            self._gl_counted = False
            self.ctx.requests -= 1
            if self.ctx.requests == 0:
                self.ctx.requests_done.set()
        super().on_finish()

    def on_connection_close(self) -> None:
        self._gl_close_upload()  # the client left mid-body: the slot and the temp file go
        super().on_connection_close()

    async def gl_run(self, spec: Op, fn: Handler, path: dict[str, str]) -> None:
        """Run one ``@op`` method: check the caller's role, parse what ``spec`` declares, call it,
        send its answer (through ``idempotency.run_keyed`` when it carries an Idempotency-Key)."""
        if spec.role is not None:
            # The route, not its summary: a summary is often a noun ("the audit log, …"), and
            # "may not the audit log" said nothing (issue 32).
            check_role(self.who, spec.role, f"call {self.request.method} {self.route}")
        kwargs: dict[str, Any] = {p.name: p.parse(self, self.ctx.limits) for p in spec.query}
        if self._gl_refused is not None:
            raise self._gl_refused
        if spec.body == "bytes":
            kwargs["upload"] = self._gl_upload
        elif spec.body == "raw":
            kwargs["data"] = b"".join(self._gl_chunks)
        elif spec.body is not None:
            kwargs["body"] = parse(spec.body, b"".join(self._gl_chunks))
        raw_key = self.request.headers.get(idempotency.HEADER) if spec.idempotent else None
        try:
            if spec.idempotent is not None and raw_key is not None:
                self.gl_keyed = True  # its long-poll outlives the client: a retry waits for it

                async def call(claim: Claim) -> idempotency.Answer:
                    self.gl_claim = claim
                    return self._gl_encode(await fn(self, **path, **kwargs), spec.status)

                answer = await idempotency.run_keyed(
                    self.ctx.keys,
                    self.cp.store,
                    mode=spec.idempotent,
                    raw_key=raw_key,
                    owner=self.who.user,
                    fp=idempotency.fingerprint(
                        self.request.method or "", self.request.path, b"".join(self._gl_chunks)
                    ),
                    now=self.cp.clock.now,
                    window=self.ctx.limits.idempotency_window,
                    call=call,
                )
                if not self._finished:
                    self._gl_write(answer)
                return
            result = await fn(self, **path, **kwargs)
        except ClientGone:
            if not self._finished:
                self.finish()  # the connection is closed: this only ends the request
            return
        if not self._finished:
            prefer = self.request.headers.get("Prefer", "")
            if spec.minimal and "return=minimal" in prefer and self._gl_serves > versions.OLDEST:
                result = None  # done, and nobody reads the answer
            self.gl_send(result, spec.status)

    # -- answers ---------------------------------------------------------------------------------

    def gl_send(self, result: Any, status: int = 200) -> None:
        self._gl_write(self._gl_encode(result, status))

    def _gl_encode(self, result: Any, status: int) -> idempotency.Answer:
        """The answer a handler's result makes (serialised once; a replay sends these bytes)."""
        if result is None:
            return idempotency.Answer(204, b"", "")
        if isinstance(result, bytes):
            return idempotency.Answer(status, result, "application/octet-stream")
        assert isinstance(result, BaseModel)
        return idempotency.Answer(status, result.model_dump_json(exclude=self.gl_exclude).encode())

    def _gl_write(self, answer: idempotency.Answer) -> None:
        self.set_header("Cache-Control", "no-store")
        if answer.replayed:
            self.set_header(idempotency.REPLAYED, "true")
        self.set_status(answer.status)
        if answer.status == 204:
            self.finish()
        elif answer.content_type == "application/octet-stream":
            self.set_header("Content-Type", answer.content_type)
            # Straight to tornado: a JSON-only base (APIHandler) would relabel the bytes.
            tornado.web.RequestHandler.finish(self, answer.body)
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(answer.body)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as ``{"code", "message", "hint", "details"}``; never a traceback."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        status, body = error_answer(exc, status_code)
        if status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="gpulayer"')
        retry_after = body.get("details", {}).get("retry_after")
        if status in (429, 503) and isinstance(retry_after, int):
            self.set_header("Retry-After", str(retry_after))
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        where = f"{self.request.method} {loggable_path(self.request.path)}"
        if isinstance(value, GPUlayerError) and value.status != 500:
            # Expected answers (4xx, 503 shutting down): one line, no traceback.
            log.info("%s: %d %s", where, value.status, value.code)
        elif isinstance(value, tornado.web.HTTPError):
            log.info("%s: %d", where, value.status_code)
        else:
            log.error("unexpected error in %s", where, exc_info=value)
