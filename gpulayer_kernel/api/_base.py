"""The machinery under the handlers: one decorator per operation, body limits, long-polls, errors.

Each handler method is declared once with ``@op(...)``: its body contract, answer contract, query
parameters and (for worker routes) the token kinds it accepts. The same declaration parses the
request, documents the route in ``openapi.json``, and feeds the route-table tests, so a new route
cannot skip authentication or the schema.

``GLMixin`` carries the shared behaviour and is written to compose with any tornado
``RequestHandler`` base, including jupyter_server's ``APIHandler``: it calls ``super().prepare()``,
answers through ``self.finish``, and leaves XSRF and user authentication to the base class.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal, TypeVar, cast

import tornado.web
from pydantic import BaseModel

from ..contracts import Contract, JobState, parse
from ..controlplane import ControlPlane
from ..errors import GPUlayerError, InvalidInput, TooLarge, Unavailable
from ..security import Principal, TokenKind, TokenService

log = logging.getLogger("gpulayer.api")

T = TypeVar("T")


@dataclass(frozen=True)
class ApiLimits:
    """Request limits. Bodies above ``max_json`` (or ``max_blob`` for raw uploads) get 413."""

    max_json: int = 8 << 20
    max_blob: int = 1 << 30
    # A too-large body up to this size is read and dropped so the client can read the 413;
    # above it the connection is closed after the answer (the only way not to read it all).
    drain_max: int = 64 << 20
    max_wait: float = 60.0


@dataclass
class ApiContext:
    """What every handler needs; one per mounted API (standalone or inside Jupyter)."""

    cp: ControlPlane
    tokens: TokenService
    limits: ApiLimits = field(default_factory=ApiLimits)
    version: str = ""
    heartbeat_interval: float | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    polls: int = 0
    polls_done: asyncio.Event = field(default_factory=asyncio.Event)

    async def drain(self, timeout: float = 1.0) -> None:
        """Stop: every long-poll answers now (503 shutting_down); wait briefly for them."""
        self.stopping.set()
        if self.polls:
            self.polls_done.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.polls_done.wait(), timeout)


# -- query parameters --------------------------------------------------------------------------

ParamKind = Literal["number", "integer", "string", "states", "label"]


@dataclass(frozen=True)
class Param:
    """One query parameter: parsed, range-checked, and described in openapi.json."""

    name: str
    kind: ParamKind
    default: Any = None
    minimum: float | None = None
    maximum: float | Literal["max_wait"] | None = None
    description: str = ""
    max_length: int = 500

    def bound(self, limits: ApiLimits) -> float | None:
        return limits.max_wait if self.maximum == "max_wait" else self.maximum

    def parse(self, handler: tornado.web.RequestHandler, limits: ApiLimits) -> Any:
        if self.kind == "states":
            values = handler.get_query_arguments(self.name)
            try:
                return [JobState(v) for v in values]
            except ValueError:
                raise self._bad(
                    ", ".join(values), f"one of {', '.join(s.value for s in JobState)}"
                ) from None
        raw = handler.get_query_argument(self.name, None)
        if raw is None:
            return self.default
        if self.kind == "string":
            if len(raw) > self.max_length:
                raise self._bad(raw[:40] + "…", f"at most {self.max_length} characters")
            return raw
        if self.kind == "label":
            key, sep, value = raw.partition("=")
            if not sep or not key:
                raise self._bad(raw, "key=value")
            return (key, value)
        try:
            number: float = int(raw) if self.kind == "integer" else float(raw)
        except ValueError:
            raise self._bad(raw, "an integer" if self.kind == "integer" else "a number") from None
        high = self.bound(limits)
        if (
            not math.isfinite(number)
            or (self.minimum is not None and number < self.minimum)
            or (high is not None and number > high)
        ):
            raise self._bad(raw, f"between {self.minimum} and {high}")
        return number

    def _bad(self, raw: str, wanted: str) -> InvalidInput:
        return InvalidInput(
            f"query parameter {self.name}={raw!r} is invalid: expected {wanted}",
            hint=f"fix ?{self.name}= (see /api/v1/openapi.json)",
            details={"parameter": self.name},
            code="bad_parameter",
        )


WAIT = Param("wait", "number", 0.0, 0, "max_wait", "long-poll: seconds to wait for news")


# -- operations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """What one handler method takes and answers (for parsing, openapi.json and tests)."""

    summary: str
    answer: type[BaseModel] | Literal["bytes"] | None = None
    body: type[Contract] | Literal["bytes"] | None = None
    status: int = 200
    query: tuple[Param, ...] = ()
    kinds: frozenset[TokenKind] | None = None  # None: a user route (client token / Jupyter)
    errors: tuple[int, ...] = ()


Handler = Callable[..., Awaitable[Any]]


def op(
    summary: str,
    *,
    answer: type[BaseModel] | Literal["bytes"] | None = None,
    body: type[Contract] | Literal["bytes"] | None = None,
    status: int = 200,
    query: Sequence[Param] = (),
    kinds: Sequence[TokenKind] | None = None,
    errors: Sequence[int] = (),
) -> Callable[[Handler], Handler]:
    """Declare a handler method; the wrapper parses query and body and sends the answer."""
    spec = Op(
        summary=summary,
        answer=answer,
        body=body,
        status=status,
        query=tuple(query),
        kinds=None if kinds is None else frozenset(kinds),
        errors=tuple(errors),
    )

    def deco(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(self: GLMixin, **path: str) -> None:
            kwargs: dict[str, Any] = {p.name: p.parse(self, self.ctx.limits) for p in spec.query}
            if self._gl_too_large:
                raise self._gl_too_large_error()
            if spec.body == "bytes":
                kwargs["data"] = b"".join(self._gl_chunks)
            elif spec.body is not None:
                kwargs["body"] = parse(spec.body, b"".join(self._gl_chunks))
            try:
                result = await fn(self, **path, **kwargs)
            except ClientGone:
                if not self._finished:
                    self.finish()  # the connection is closed: this only ends the request
                return
            if not self._finished:
                self.gl_send(result, spec.status)

        # User routes: tornado's own decorator, so a Jupyter host's auth (and XSRF) applies as
        # for any APIHandler; the standalone base sets current_user from a client token.
        final: Handler = wrapper
        if spec.kinds is None:
            final = cast(Handler, tornado.web.authenticated(wrapper))
        final.__gl_op__ = spec  # type: ignore[attr-defined]
        return final

    return deco


def op_of(method: object) -> Op | None:
    return getattr(method, "__gl_op__", None)


class ClientGone(Exception):
    """The client closed its connection during a long-poll: nothing to answer."""


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "validation_failed",
    503: "unavailable",
}


@tornado.web.stream_request_body
class GLMixin(tornado.web.RequestHandler):
    """Shared behaviour of every GPUlayer handler; put it first in the bases."""

    ctx: ApiContext
    route: str = ""  # e.g. "/jobs/{job_id}"; the factories turn it into a tornado pattern
    principal: Principal | None = None

    def initialize(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self._gl_chunks: list[bytes] = []
        self._gl_size = 0
        self._gl_limit = ctx.limits.max_json
        self._gl_too_large = False
        self._gl_closed = asyncio.Event()
        self._gl_polling = False

    @property
    def cp(self) -> ControlPlane:
        return self.ctx.cp

    # -- request ---------------------------------------------------------------------------------

    def gl_op(self) -> Op | None:
        method = (self.request.method or "").lower()
        return op_of(getattr(self, method, None))

    async def prepare(self) -> None:
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
        self._gl_limit = limits.max_blob if spec.body == "bytes" else limits.max_json
        length = self.request.headers.get("Content-Length")
        declared = int(length) if length and length.isdigit() else None
        if declared is not None and declared > self._gl_limit:
            self._gl_too_large = True
            if declared > limits.drain_max:
                raise self._gl_too_large_error()
        connection = self.request.connection
        if connection is not None and hasattr(connection, "set_max_body_size"):
            # Without a Content-Length (chunked), allow up to the drain size so an oversize
            # body is counted, dropped and answered with 413 rather than cut off.
            drain = limits.drain_max if declared is None else declared
            connection.set_max_body_size(max(self._gl_limit, drain))

    def data_received(self, chunk: bytes) -> None:
        self._gl_size += len(chunk)
        if self._gl_too_large or self._gl_size > self._gl_limit:
            self._gl_too_large = True
            self._gl_chunks.clear()
            return
        self._gl_chunks.append(chunk)

    def _gl_too_large_error(self) -> TooLarge:
        what = "upload" if self._gl_limit == self.ctx.limits.max_blob else "request body"
        return TooLarge(
            f"the {what} is over the {self._gl_limit}-byte limit",
            hint="large files travel as bundles or artifacts; large logs in several batches",
            details={"limit": self._gl_limit},
            code="body_too_large",
        )

    # -- answers ---------------------------------------------------------------------------------

    def gl_send(self, result: Any, status: int = 200) -> None:
        self.set_header("Cache-Control", "no-store")
        if result is None:
            self.set_status(204)
            self.finish()
        elif isinstance(result, bytes):
            self.set_status(status)
            self.set_header("Content-Type", "application/octet-stream")
            # Straight to tornado: a JSON-only base (APIHandler) would relabel the bytes.
            tornado.web.RequestHandler.finish(self, result)
        else:
            assert isinstance(result, BaseModel)
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.finish(result.model_dump_json())

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as ``{"code", "message", "hint", "details"}``; never a traceback."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, GPUlayerError):
            status, body = exc.status, exc.to_json()
        elif isinstance(exc, tornado.web.HTTPError):
            status = exc.status_code
            body = _http_error_body(status, exc.log_message % exc.args if exc.log_message else "")
        elif exc is None:
            status, body = status_code, _http_error_body(status_code, "")
        else:
            status = 500
            body = {
                "code": "internal",
                "message": "internal server error",
                "hint": "the server log has the details; please report it",
                "details": {},
            }
        if status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="gpulayer"')
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        where = f"{self.request.method} {_TOKEN_RE.sub('glt_***', self.request.path)}"
        if isinstance(value, GPUlayerError) and value.status != 500:
            # Expected answers (4xx, 503 shutting down): one line, no traceback.
            log.info("%s: %d %s", where, value.status, value.code)
        elif isinstance(value, tornado.web.HTTPError):
            log.info("%s: %d", where, value.status_code)
        else:
            log.error("unexpected error in %s", where, exc_info=value)

    # -- long-polls ------------------------------------------------------------------------------

    def on_finish(self) -> None:
        if self._gl_polling:
            self._gl_polling = False
            self.ctx.polls -= 1
            if self.ctx.polls == 0:
                self.ctx.polls_done.set()
        super().on_finish()

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self._gl_closed.set()

    @property
    def client_gone(self) -> bool:
        return self._gl_closed.is_set()

    async def long_poll(self, wait: float, call: Awaitable[T]) -> T:
        """Await a ControlPlane long-poll, giving up when the client leaves or the server stops.

        The loop is never blocked: the wait is the ControlPlane's condition, raced against the
        connection's close and the server's stop.
        """
        if wait <= 0:
            return await call
        ctx = self.ctx
        if ctx.stopping.is_set():
            _close_awaitable(call)
            raise _shutting_down()
        task = asyncio.ensure_future(call)
        gone = asyncio.ensure_future(self._gl_closed.wait())
        stop = asyncio.ensure_future(ctx.stopping.wait())
        if not self._gl_polling:
            # Counted until the answer is written (on_finish), so a stopping server's drain()
            # waits for the 503 to go out before it closes connections.
            self._gl_polling = True
            ctx.polls += 1
        try:
            await asyncio.wait({task, gone, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._gl_closed.is_set():
            raise ClientGone()
        raise _shutting_down()


def _shutting_down() -> Unavailable:
    return Unavailable(
        "the server is shutting down",
        hint="retry in a moment (clients and workers do this on their own)",
        code="shutting_down",
    )


def _close_awaitable(call: Awaitable[Any]) -> None:
    close = getattr(call, "close", None)
    if close is not None:
        close()


def _http_error_body(status: int, detail: str) -> dict[str, Any]:
    try:
        phrase = HTTPStatus(status).phrase.lower()
    except ValueError:
        phrase = "error"
    message = detail or phrase
    hint = {
        404: "see /api/v1/openapi.json for the routes",
        405: "see /api/v1/openapi.json for the methods of this route",
        403: "this request is not allowed with these credentials",
    }.get(status, "")
    return {
        "code": _HTTP_CODES.get(status, "internal" if status >= 500 else "bad_request"),
        "message": message,
        "hint": hint,
        "details": {},
    }


_TOKEN_RE = re.compile(r"glt_[A-Za-z0-9_-]+")
_PARAM_RE = re.compile(r"\{(\w+)(?::(path))?\}")


def route_pattern(prefix: str, template: str) -> str:
    """``/jobs/{job_id}/artifacts/{name:path}`` → a tornado regex with named groups."""

    def group(m: re.Match[str]) -> str:
        return f"(?P<{m.group(1)}>.+)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+)"

    return prefix.rstrip("/") + _PARAM_RE.sub(group, template) + "/?"


def openapi_path(template: str) -> str:
    return _PARAM_RE.sub(lambda m: "{" + m.group(1) + "}", template)
