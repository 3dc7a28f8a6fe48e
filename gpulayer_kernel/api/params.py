"""What a request may carry: its size limits, its query parameters and its path parameters.

A query parameter is declared once as a ``Param`` in a handler's ``@op``; the same declaration
parses and range-checks it and describes it in ``openapi.json``. Route templates name their path
parameters as ``{job_id}`` (one segment) or ``{name:path}`` (the rest of the path).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import tornado.web

from ..bundles import MAX_BUNDLE_BYTES
from ..contracts import JobState
from ..contracts.limits import MAX_BODY
from ..errors import InvalidInput

# What an integer parameter may be at most when its declaration names no bound: the store's
# integers are signed 64-bit, and a larger value would fail there (a 500) instead of here.
INT64_MAX = (1 << 63) - 1
# ASCII digits only: ``int()`` also takes "1_000", " 7 " and non-ASCII digits such as "٣".
_INTEGER = re.compile(r"[-+]?[0-9]{1,40}")
_NUMBER = re.compile(
    r"[-+]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})"  # 12, 1.5, .5
    r"(?:[eE][-+]?[0-9]{1,3})?"  # 1e9 (an overflow to inf is refused as not finite)
)


@dataclass(frozen=True)
class ApiLimits:
    """Request limits: bodies over theirs get 413; more than ``max_uploads`` at once get 503."""

    max_json: int = MAX_BODY  # the limit workers split their reports to fit
    max_blob: int = 1 << 30  # an artifact a worker uploads (checkpoints can be large)
    max_bundle: int = MAX_BUNDLE_BYTES  # a bundle: the one limit the worker enforces too
    # A too-large body up to this size is read and dropped so the client can read the 413;
    # above it the connection is closed after the answer (the only way not to read it all).
    drain_max: int = 64 << 20
    max_wait: float = 60.0
    # Uploads streaming to disk at once; each holds a file and up to ``upload_buffer`` bytes.
    max_uploads: int = 4
    upload_buffer: int = 1 << 20
    # How long an Idempotency-Key's answer is kept and replayed (ADR 0003): 24 h.
    idempotency_window: float = 24 * 3600.0


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
        """The largest value accepted (an integer without a declared one: ``INT64_MAX``)."""
        if self.maximum == "max_wait":
            return limits.max_wait
        if self.maximum is None and self.kind == "integer":
            return INT64_MAX
        return self.maximum

    def floor(self) -> float | None:
        """The smallest value accepted (an integer without a declared one: ``-INT64_MAX``)."""
        if self.minimum is None and self.kind == "integer":
            return -INT64_MAX
        return self.minimum

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
        integer = self.kind == "integer"
        if not (_INTEGER if integer else _NUMBER).fullmatch(raw):
            raise self._bad(raw[:40], "an integer" if integer else "a number")
        number: float = int(raw) if integer else float(raw)
        low, high = self.floor(), self.bound(limits)
        if (
            not math.isfinite(number)
            or (low is not None and number < low)
            or (high is not None and number > high)
        ):
            raise self._bad(raw, f"between {_show(low)} and {_show(high)}")
        return number

    def _bad(self, raw: str, wanted: str) -> InvalidInput:
        return InvalidInput(
            f"query parameter {self.name}={raw!r} is invalid: expected {wanted}",
            hint=f"fix ?{self.name}= (see /api/v1/openapi.json)",
            details={"parameter": self.name},
            code="bad_parameter",
        )


def path_integer(name: str, raw: str, minimum: int = 0) -> int:
    """A path parameter that is an integer (``/sessions/s/cells/{number}``), range-checked."""
    if not _INTEGER.fullmatch(raw) or not minimum <= int(raw) <= INT64_MAX:
        raise InvalidInput(
            f"path parameter {name}={raw[:40]!r} is invalid: expected an integer >= {minimum}",
            hint="see /api/v1/openapi.json",
            details={"parameter": name},
            code="bad_parameter",
        )
    return int(raw)


def _show(bound: float | None) -> str:
    if bound is None:
        return "any"
    return str(int(bound)) if float(bound).is_integer() else str(bound)


WAIT = Param("wait", "number", 0.0, 0, "max_wait", "long-poll: seconds to wait for news")


# -- path parameters ---------------------------------------------------------------------------

_PATH_PARAM = re.compile(r"\{(\w+)(?::(path))?\}")


def path_params(template: str) -> list[str]:
    """The names of a route template's path parameters, in order."""
    return [m.group(1) for m in _PATH_PARAM.finditer(template)]


def route_pattern(prefix: str, template: str) -> str:
    """``/jobs/{job_id}/artifacts/{name:path}`` → a tornado regex with named groups."""

    def group(m: re.Match[str]) -> str:
        if m.group(2):
            return f"(?P<{m.group(1)}>.+)"
        if m.group(1) == "worker_id":
            # ``/workers/{worker_id}`` must not shadow the worker route ``/workers/join``,
            # mounted after the user routes (tornado takes the first match).
            return "(?P<worker_id>(?!join/?$)[^/]+)"
        return f"(?P<{m.group(1)}>[^/]+)"

    return prefix.rstrip("/") + _PATH_PARAM.sub(group, template) + "/?"


def openapi_path(template: str) -> str:
    """``/jobs/{job_id}/artifacts/{name:path}`` → ``/jobs/{job_id}/artifacts/{name}``."""
    return _PATH_PARAM.sub(lambda m: "{" + m.group(1) + "}", template)
