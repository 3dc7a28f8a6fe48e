"""One declaration per operation: ``@op(...)`` on a handler method.

Each handler method is declared once with ``@op(...)``: its body contract, answer contract, query
parameters, and who may call it: for worker routes the token kinds it accepts, for user routes
the least role (``role=``: viewer, user or admin; required). The same declaration parses the
request (``GLMixin.gl_run``, which checks the caller's role before anything else), documents the
route in ``openapi.json``, and feeds the route-table tests (every route × every token kind and
every role), so a new route cannot skip authentication, authorization or the schema. Whose
work a call may touch is the ControlPlane's to check (``who=``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, cast

import tornado.web
from pydantic import BaseModel

from ..contracts import Contract
from ..security import Role, TokenKind
from .params import Param


@dataclass(frozen=True)
class Op:
    """What one handler method takes and answers (for parsing, openapi.json and tests)."""

    summary: str
    answer: type[BaseModel] | Literal["bytes"] | None = None
    # "bytes": streamed to disk as an ``Upload``; "raw": kept in memory, handed in as ``data``
    # (a workspace pack, ADR 0022: unpacked into many blobs, never stored whole).
    body: type[Contract] | Literal["bytes", "raw"] | None = None
    status: int = 200
    query: tuple[Param, ...] = ()
    kinds: frozenset[TokenKind] | None = None  # None: a user route (client token / Jupyter)
    # No token at all (``GET /health`` only): tests/security/test_route_auth.py keeps the list.
    public: bool = False
    role: Role | None = None  # user routes: the least role that may call it
    errors: tuple[int, ...] = ()
    # For a raw body (``body="bytes"``): which ``ApiLimits`` field bounds it.
    upload_limit: Literal["max_blob", "max_bundle"] = "max_blob"
    # For a JSON body that may be larger than ``ApiLimits.max_json`` (a kernel's message): its own.
    body_limit: int | None = None
    # Protocol 1.1: answered 204 with no body when the caller sends ``Prefer: return=minimal``
    # (RFC 7240; a worker that never reads the answer need not receive it).
    minimal: bool = False
    # Takes an ``Idempotency-Key`` (ADR 0003, ``idempotency.py``): "replay" answers a retry
    # with the stored answer, "follow" runs it again bound to the jobs it made (``/jobs/run``),
    # "once" refuses a retry the first try of which a restart cut off (409).
    idempotent: Literal["replay", "follow", "once"] | None = None


class Operation(NamedTuple):
    """One row of the route table: (route template, method, handler class, its ``Op``)."""

    template: str
    method: str
    handler: type[tornado.web.RequestHandler]
    op: Op


Handler = Callable[..., Awaitable[Any]]


class Runner(Protocol):
    """What the decorated method's class offers: ``GLMixin.gl_run``."""

    async def gl_run(self, spec: Op, fn: Handler, path: dict[str, str]) -> None: ...


def op(
    summary: str,
    *,
    answer: type[BaseModel] | Literal["bytes"] | None = None,
    body: type[Contract] | Literal["bytes", "raw"] | None = None,
    status: int = 200,
    query: Sequence[Param] = (),
    kinds: Sequence[TokenKind] | None = None,
    errors: Sequence[int] = (),
    upload_limit: Literal["max_blob", "max_bundle"] = "max_blob",
    body_limit: int | None = None,
    public: bool = False,
    role: Role | None = None,
    minimal: bool = False,
    idempotent: Literal["replay", "follow", "once"] | None = None,
) -> Callable[[Handler], Handler]:
    """Declare a handler method; the wrapper parses query and body and sends the answer.

    A raw body (``body="bytes"``) reaches the method as ``upload``: an ``uploads.Upload``
    already on disk, which the method commits under its digest.
    """
    if not public and (kinds is None) == (role is None):
        raise TypeError(
            f"{summary!r}: a user route declares role=, a worker route kinds= (and a public "
            "one neither)"
        )
    spec = Op(
        summary=summary,
        answer=answer,
        body=body,
        status=status,
        query=tuple(query),
        kinds=None if kinds is None else frozenset(kinds),
        errors=tuple(errors),
        upload_limit=upload_limit,
        body_limit=body_limit,
        public=public,
        role=role,
        minimal=minimal,
        idempotent=idempotent,
    )

    def deco(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(self: Runner, **path: str) -> None:
            await self.gl_run(spec, fn, path)

        # User routes: tornado's own decorator, so a Jupyter host's auth (and XSRF) applies as
        # for any APIHandler; the standalone base sets current_user from a client token.
        final: Handler = wrapper
        if spec.kinds is None and not spec.public:
            final = cast(Handler, tornado.web.authenticated(wrapper))
        final.__gl_op__ = spec  # type: ignore[attr-defined]
        return final

    return deco


def op_of(method: object) -> Op | None:
    """The ``Op`` a method was declared with, or None for a method that is no operation."""
    return getattr(method, "__gl_op__", None)


METHODS = ("get", "head", "post", "put", "delete")


def operations_of(handlers: Sequence[type[tornado.web.RequestHandler]]) -> list[Operation]:
    """Every operation the given handler classes declare, in table order."""
    out = []
    for handler in handlers:
        route: str = getattr(handler, "route", "")
        for method in METHODS:
            spec = op_of(handler.__dict__.get(method))
            if spec is not None:
                out.append(Operation(route, method, handler, spec))
    return out
