"""Errors at the HTTP edge: how any exception becomes one JSON answer (``GLMixin.write_error``).

``{"code", "message", "hint", "details"}`` with the status of the ``GPUlayerError`` class
(``gpulayer_kernel/errors.py``); tornado's own ``HTTPError`` (404 route, 405 method, 400 bad
encoding) gets a stable code too; anything unexpected is ``500 internal`` with no traceback (the
traceback goes to the server log only).
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import tornado.web

from ..errors import GPUlayerError

HTTP_CODES = {
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

INTERNAL = {
    "code": "internal",
    "message": "internal server error",
    "hint": "the server log has the details; please report it",
    "details": {},
}


def error_body(status: int, detail: str) -> dict[str, Any]:
    """The JSON of a plain HTTP error (a route or method that does not exist, bad encoding)."""
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
        "code": HTTP_CODES.get(status, "internal" if status >= 500 else "bad_request"),
        "message": message,
        "hint": hint,
        "details": {},
    }


def error_answer(exc: BaseException | None, status_code: int) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) for an exception raised by a handler; never a traceback."""
    if isinstance(exc, GPUlayerError):
        return exc.status, exc.to_json()
    if isinstance(exc, tornado.web.HTTPError):
        detail = exc.log_message % exc.args if exc.log_message else ""
        return exc.status_code, error_body(exc.status_code, detail)
    if exc is None:
        return status_code, error_body(status_code, "")
    return 500, dict(INTERNAL)


_TOKEN_RE = re.compile(r"glt_[A-Za-z0-9_-]+")


def loggable_path(path: str) -> str:
    """The path for a log line: a token pasted into a URL by mistake is masked."""
    return _TOKEN_RE.sub("glt_***", path)
