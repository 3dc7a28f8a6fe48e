"""Errors at the HTTP edge: one ``write_error`` (in ``GLMixin``) turns any exception into JSON.

``{"code", "message", "hint", "details"}`` with the status of the ``GPUlayerError`` class
(``gpulayer_kernel/errors.py``); tornado's own ``HTTPError`` (404 route, 405 method, 400 bad
encoding) gets a stable code too; anything unexpected is ``500 internal`` with no traceback (the
traceback goes to the server log only).
"""

from __future__ import annotations

from ._base import GLMixin, _http_error_body

error_body = _http_error_body
write_error = GLMixin.write_error

__all__ = ["error_body", "write_error"]
