"""``GET /api/v1/openapi.json``: OpenAPI 3.1 generated from the handlers' ``@op`` declarations and
the pydantic contracts (``model_json_schema``), so the document cannot drift from the code.

The document describes the route table it is given (``routes.operations()``); the handler reads
its mount's table from the ``ApiContext``, so this module needs no route table of its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..contracts import JobState
from ..security import Role
from .context import package_version
from .idempotency import HEADER, MAX_KEY
from .mixin import GLMixin
from .models import ErrorBody
from .ops import Operation, op
from .params import ApiLimits, Param, openapi_path, path_params

_SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
ERROR_TEXT = {
    400: "invalid input",
    401: "no token, or an invalid, expired, revoked or replayed one",
    403: "a token of the wrong kind, or another worker's job",
    404: "not found",
    409: "conflict (e.g. an illegal state change)",
    413: "body over the size limit",
    422: "a contract did not validate",
    503: "shutting down, or unavailable",
}


# The header of keyed writes (ADR 0003, ``idempotency.py``), on every operation that takes it.
IDEMPOTENCY_PARAM: dict[str, Any] = {
    "name": HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY, "pattern": "^[!-~]+$"},
    "description": "a fresh random key per write, the same on its retries: a retry within "
    "24 h gets the first answer again (header Idempotency-Replayed: true) and makes nothing "
    "twice; the same key with another body, 409 idempotency_key_reused",
}


def _param_schema(p: Param, limits: ApiLimits) -> dict[str, Any]:
    schema: dict[str, Any]
    if p.kind == "states":
        return {"type": "array", "items": {"type": "string", "enum": [s.value for s in JobState]}}
    if p.kind == "label":
        return {"type": "string", "pattern": "^[^=]+=.*$", "maxLength": p.max_length}
    if p.kind == "string":
        return {"type": "string", "maxLength": p.max_length}
    schema = {"type": "integer" if p.kind == "integer" else "number"}
    low = p.floor()
    if low is not None:
        schema["minimum"] = low
    high = p.bound(limits)
    if high is not None:
        schema["maximum"] = high
    if p.default is not None:
        schema["default"] = p.default
    return schema


@functools.lru_cache(maxsize=8)
def openapi_json(
    ops: tuple[Operation, ...], limits: ApiLimits, version: str | None = None, base: str = "/api/v1"
) -> str:
    """``build_openapi`` as text, made once per mount."""
    return json.dumps(build_openapi(ops, limits, version, base))


def build_openapi(
    ops: Sequence[Operation],
    limits: ApiLimits | None = None,
    version: str | None = None,
    base: str = "/api/v1",
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the operations ``ops`` (``routes.operations()``)."""
    limits = limits or ApiLimits()
    wanted: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
        (ErrorBody, "serialization")
    ]
    for *_, spec in ops:
        if isinstance(spec.body, type):
            wanted.append((spec.body, "validation"))
        if isinstance(spec.answer, type):
            wanted.append((spec.answer, "serialization"))
    keys, top = models_json_schema(
        list(dict.fromkeys(wanted)), ref_template="#/components/schemas/{model}"
    )
    schemas = top.get("$defs", {})

    def ref(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> Any:
        return keys[(model, mode)]

    error = {"application/json": {"schema": ref(ErrorBody, "serialization")}}
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    paths: dict[str, dict[str, Any]] = {}
    for template, method, handler, spec in ops:
        params: list[dict[str, Any]] = []
        for name in path_params(template):
            schema = _SHA256 if name == "digest" else {"type": "string", "minLength": 1}
            params.append({"name": name, "in": "path", "required": True, "schema": schema})
        for p in spec.query:
            q: dict[str, Any] = {
                "name": p.name,
                "in": "query",
                "required": False,
                "schema": _param_schema(p, limits),
            }
            if p.description:
                q["description"] = p.description
            if p.kind == "states":
                q["style"], q["explode"] = "form", True
            params.append(q)
        if spec.idempotent is not None:
            params.append(IDEMPOTENCY_PARAM)
        responses: dict[str, Any] = {}
        ok: dict[str, Any] = {"description": "ok"}
        if spec.answer == "bytes":
            ok["content"] = binary
        elif isinstance(spec.answer, type):
            ok["content"] = {"application/json": {"schema": ref(spec.answer, "serialization")}}
        elif handler is OpenApiHandler:
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        responses[str(spec.status)] = ok
        statuses = {*spec.errors} if spec.public else {400, 401, 403, 404, *spec.errors}
        if spec.body is not None:
            statuses |= {413, 422}
        if any(p is not None and p.maximum == "max_wait" for p in spec.query):
            statuses.add(503)
        if spec.kinds is not None and template.startswith("/worker/jobs"):
            statuses.add(409)
        if spec.idempotent is not None:
            statuses.add(409)  # idempotency_key_reused, idempotency_key_unresolved
        for status in sorted(statuses):
            responses[str(status)] = {"description": ERROR_TEXT.get(status, "error")}
            if method != "head":
                responses[str(status)]["content"] = error
        if method == "head":
            responses["404"] = {"description": "absent"}
        operation: dict[str, Any] = {
            "operationId": f"{method}_{handler.__name__}",
            "summary": spec.summary,
            "tags": ["public" if spec.public else "user" if spec.kinds is None else "worker"],
            "parameters": params,
            "responses": responses,
            "security": [] if spec.public else [{"bearer": []}],
        }
        if spec.kinds is not None:
            kinds = ", ".join(sorted(k.value for k in spec.kinds))
            operation["description"] = f"Worker route; accepts {kinds} tokens."
        elif spec.role is not None:
            operation["description"] = f"User route; the least role: {spec.role.value}."
        if spec.body == "bytes" or spec.body == "raw":
            operation["requestBody"] = {"required": True, "content": binary}
        elif spec.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref(spec.body, "validation")}},
            }
        paths.setdefault(openapi_path(template), {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "GPUlayer API",
            "version": version or package_version(),
            "description": "Contracts: gpulayer_kernel/contracts; routes: docs/api-routes.md. "
            "Errors are {code, message, hint, details}.",
        },
        "servers": [{"url": base}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "GPUlayer token glt_<kind>_<id>_<secret>; user routes take "
                    "client tokens (or Jupyter's login when hosted by Jupyter), worker routes "
                    "worker tokens",
                }
            },
        },
    }


class OpenApiHandler(GLMixin):
    route = "/openapi.json"

    @op("this API as OpenAPI 3.1, generated from the contracts", answer=None, role=Role.VIEWER)
    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        base = self.request.path.rsplit("/openapi.json", 1)[0]
        ctx = self.ctx
        self.finish(openapi_json(ctx.operations, ctx.limits, ctx.version, base))
