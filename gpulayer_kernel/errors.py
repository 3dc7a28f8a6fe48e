"""The one error hierarchy of GPUlayer: every failure a user can meet has a stable code.

Each error carries a stable ``code`` (never renamed once shipped), the HTTP ``status`` it maps to,
a ``message`` that names the field or file at fault, a ``hint`` with the next step, and optional
JSON ``details``. The HTTP layer turns any of them into ``{"code", "message", "hint", "details"}``;
the CLI prints message and hint; no traceback ever reaches a user for one of these.

    GPUlayerError (500 internal)
    ├── InvalidInput (400 invalid_input)
    │   ├── ValidationFailed (422 validation_failed)      a contract did not validate
    │   ├── NotJSON (422 not_json)                        an argument/result is not JSON
    │   ├── BundleError (422 bundle_invalid)              bad archive, traversal, digest mismatch
    │   ├── BadOption (400 bad_option)                    a job option's value (``jobopts.py``)
    │   └── UnknownOption (400 unknown_option)            an option the edge does not take
    ├── Unauthorized (401 unauthorized)                   no or unknown credentials
    ├── Forbidden (403 forbidden)                         credentials of the wrong kind
    ├── NotFound (404 not_found)
    │   └── ConfigInvalid (422 config_invalid)            a providers/costs config file
    ├── Conflict (409 conflict)                           e.g. an illegal state transition
    │   └── BudgetExceeded (409 budget_exceeded)          a job's estimate is over a budget
    ├── TooLarge (413 too_large)
    ├── QuotaExceeded (429 quota_exceeded)                a user or group is at a quota
    ├── Busy (429 busy)                                   a bounded buffer is full: send later
    ├── Unavailable (503 unavailable)                     locked state dir, server gone
    │   └── ProviderError (503 provider_error)            a provider failed, hung or refused
    ├── StoreError (500 store_error)
    │   ├── SchemaTooNew (500 schema_too_new)             database written by a newer GPUlayer
    │   └── SecretsKeyError (500 secrets_key)             the key sealing secrets is missing/wrong
    └── MissingExtra (500 missing_extra)                  an optional part is not installed;
                                                          also an ImportError, never sent by HTTP
"""

from __future__ import annotations

from typing import Any, ClassVar


class GPUlayerError(Exception):
    """Base of every GPUlayer error; carries a stable code, an HTTP status and a hint."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        details: dict[str, Any] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details: dict[str, Any] = details or {}
        if code is not None:
            # A more specific stable code within the same class (e.g. "job_not_found").
            self.code = code  # type: ignore[misc]

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
        }

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class InvalidInput(GPUlayerError):
    code = "invalid_input"
    status = 400


class ValidationFailed(InvalidInput):
    code = "validation_failed"
    status = 422


class NotJSON(InvalidInput):
    code = "not_json"
    status = 422


class BadOption(InvalidInput):
    """A job option's value does not parse (``--gpus two``, ``--timeout soon``)."""

    code = "bad_option"


class UnknownOption(InvalidInput):
    """An option the edge does not take (``jobopts.parse``)."""

    code = "unknown_option"


class BundleError(InvalidInput):
    code = "bundle_invalid"
    status = 422


class ConfigInvalid(InvalidInput):
    code = "config_invalid"
    status = 422


class Unauthorized(GPUlayerError):
    code = "unauthorized"
    status = 401


class Forbidden(GPUlayerError):
    code = "forbidden"
    status = 403


class NotFound(GPUlayerError):
    code = "not_found"
    status = 404


class Conflict(GPUlayerError):
    code = "conflict"
    status = 409


class BudgetExceeded(Conflict):
    code = "budget_exceeded"
    status = 409


class TooLarge(GPUlayerError):
    code = "too_large"
    status = 413


class QuotaExceeded(GPUlayerError):
    code = "quota_exceeded"
    status = 429


class Busy(GPUlayerError):
    """A bounded buffer (a kernel's lane) is full: the same request succeeds once it drains."""

    code = "busy"
    status = 429


class Unavailable(GPUlayerError):
    code = "unavailable"
    status = 503


class ProviderError(Unavailable):
    code = "provider_error"
    status = 503


class StoreError(GPUlayerError):
    code = "store_error"
    status = 500


class SchemaTooNew(StoreError):
    code = "schema_too_new"
    status = 500


class MissingExtra(GPUlayerError, ImportError):
    """A part of GPUlayer that needs an extra (``pip install 'gpulayer[jupyter]'``) was used
    without it. It is an ``ImportError`` too, so ``except ImportError`` still catches it."""

    code = "missing_extra"
    status = 500

    @classmethod
    def of(cls, extra: str, what: str, exc: ImportError) -> MissingExtra:
        """The error for ``what`` (e.g. "the %%gpulayer magics") failing to import ``exc.name``."""
        import sys

        module = (exc.name or str(exc)).split(".")[0]  # the package to install, not a submodule
        return cls(
            f"{what}: the '{extra}' extra of gpulayer is not installed (no module {module!r})",
            hint=f"pip install 'gpulayer[{extra}]' (into {sys.prefix}), then restart the "
            "kernel or process",
            details={"extra": extra, "module": module},
        )


class SecretsKeyError(StoreError):
    code = "secrets_key"
    status = 500


ERRORS_BY_CODE: dict[str, type[GPUlayerError]] = {
    cls.code: cls
    for cls in (
        GPUlayerError,
        InvalidInput,
        ValidationFailed,
        NotJSON,
        BundleError,
        ConfigInvalid,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        BudgetExceeded,
        TooLarge,
        QuotaExceeded,
        Busy,
        Unavailable,
        ProviderError,
        StoreError,
        SchemaTooNew,
        SecretsKeyError,
    )
}


def from_json(status: int, body: dict[str, Any]) -> GPUlayerError:
    """Rebuild an error sent by the HTTP API (used by the client so callers see the same types)."""
    code = str(body.get("code", "internal"))
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        cls = next(
            (c for c in ERRORS_BY_CODE.values() if c.status == status and c is not GPUlayerError),
            GPUlayerError,
        )
    return cls(
        str(body.get("message", "")),
        hint=str(body.get("hint", "")),
        details=body.get("details") or {},
        code=code,
    )
