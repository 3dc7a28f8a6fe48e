"""Display data as Jupyter has it — ``{"data": {mime: ...}, "metadata": {...}}`` — bounded in size.

A cell on a worker (a session's, or a one-shot ``%%gpulayer`` cell's last value) shows things the
way a local cell does: as MIME bundles (``text/plain``, ``text/html``, ``image/png`` in base64,
``application/json``…), which travel as JSON and which the kernel publishes as its own. This
module is what every side agrees on: the shape (:func:`content`), the size limit and how a bundle
past it is cut (:func:`bound`: the largest entries go first, ``text/plain`` stays and says what
was dropped; never an error), the text form a log or terminal shows (:func:`text_of`), masking
secrets in the text entries (:func:`redact`), and — for a one-shot cell, which runs without
IPython — a small formatter that asks an object for its ``_repr_*_`` forms (:func:`format_value`).

Standard library only: it is imported in job processes, where start-up time counts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

MAX_ENV = "GPULAYER_MAX_DISPLAY_BYTES"
DEFAULT_MAX_BYTES = 4 << 20  # one display; a figure is ~50 KB (the API takes 8 MiB a request)
MAX_TEXT = 200_000  # characters of text/plain kept when even the text is past the limit
CLEAR = "application/vnd.gpulayer.clear+json"  # IPython's clear_output, as a display

# Mime types whose values are text a secret could appear in (the others are base64 or numbers).
_TEXT_TYPES = ("text/", "application/json", "application/javascript", "image/svg+xml")
# _repr_*_ methods, in IPython's order of preference (its DisplayFormatter's formatters).
_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
)


def max_bytes() -> int:
    try:
        return max(1024, int(os.environ.get(MAX_ENV, "")))
    except ValueError:
        return DEFAULT_MAX_BYTES


def content(
    data: Mapping[str, Any], metadata: Mapping[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """A display as it travels: ``{"data", "metadata"}`` plus ``transient``/``update`` when set."""
    out: dict[str, Any] = {"data": dict(data), "metadata": dict(metadata or {})}
    out.update({k: v for k, v in extra.items() if v})
    return out


def text_of(display: Mapping[str, Any] | None) -> str:
    """The text form of a display (its ``text/plain``), or a note of what it holds."""
    if not display:
        return ""
    data = display.get("data") or {}
    if CLEAR in data:
        return ""
    text = data.get("text/plain")
    if isinstance(text, str):
        return text
    kinds = ", ".join(sorted(str(k) for k in data)) or "nothing"
    return f"<display: {kinds}>"


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def bound(display: dict[str, Any], limit: int | None = None) -> dict[str, Any]:
    """The display cut to ``limit`` bytes of JSON: drop its largest entries (never text/plain
    first), then cut text/plain; the text says what went and how to keep it. Never raises."""
    limit = max_bytes() if limit is None else limit
    if _size(display) <= limit:
        return display
    data = dict(display.get("data") or {})
    dropped: list[str] = []
    for mime in sorted(data, key=lambda m: (m == "text/plain", -_size(data[m]))):
        if _size({**display, "data": data}) <= limit:
            break
        if mime == "text/plain":
            continue
        dropped.append(f"{mime} ({human_bytes(_size(data[mime]))})")
        del data[mime]
    text = data.get("text/plain")
    if not isinstance(text, str):
        text = ""
    note = (
        f"[gpulayer: display output past the {human_bytes(limit)} limit ({MAX_ENV}): dropped "
        + (", ".join(dropped) if dropped else "part of its text")
        + "; save large output to $GPULAYER_OUTPUT as an artifact instead]"
    )
    budget = max(0, min(MAX_TEXT, limit // 2 - len(note)))
    if len(text) > budget:
        text = text[:budget] + f"… ({len(text) - budget} more characters)"
    data["text/plain"] = f"{text}\n{note}" if text else note
    return {**display, "data": data, "metadata": {}}


def redact(display: dict[str, Any], mask: Callable[[str], str]) -> dict[str, Any]:
    """The display with ``mask`` applied to its text entries (images stay as they are)."""
    data = display.get("data")
    if not isinstance(data, dict):
        return display
    masked = {
        mime: _mask(value, mask) if mime.startswith(_TEXT_TYPES) else value
        for mime, value in data.items()
    }
    return {**display, "data": masked}


def _mask(value: Any, mask: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, list):
        return [_mask(v, mask) for v in value]
    if isinstance(value, dict):
        return {k: _mask(v, mask) for k, v in value.items()}
    return value


def format_value(value: Any) -> dict[str, Any]:
    """A display of ``value`` without IPython: its ``_repr_mimebundle_`` or ``_repr_*_`` forms,
    and ``repr`` as text/plain (what a one-shot cell on a worker shows for a non-JSON value)."""
    data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    method = _repr_method(value, "_repr_mimebundle_")
    if method is not None:
        bundle = _call(method)
        if isinstance(bundle, tuple) and len(bundle) == 2:
            bundle, md = bundle
            if isinstance(md, dict):
                metadata.update(md)
        if isinstance(bundle, dict):
            data.update({str(k): v for k, v in bundle.items() if _jsonable(v)})
    for mime, name in _REPR_METHODS:
        if mime in data:
            continue
        method = _repr_method(value, name)
        if method is None:
            continue
        got = _call(method)
        if isinstance(got, tuple) and len(got) == 2:
            got, md = got
            if isinstance(md, dict):
                metadata[mime] = md
        if isinstance(got, bytes) and mime.startswith("image/"):
            import base64

            got = base64.b64encode(got).decode()
        if got is not None and _jsonable(got):
            data[mime] = got
    if "text/plain" not in data:
        data["text/plain"] = _repr(value)
    return bound(content(data, metadata))


def _repr_method(value: Any, name: str) -> Callable[[], Any] | None:
    # Looked up on the type, as IPython does: a class (not an instance) has them unbound.
    if isinstance(value, type):
        return None
    method = getattr(type(value), name, None)
    if method is None:
        return None
    return lambda: method(value)


def _call(method: Callable[[], Any]) -> Any:
    try:
        return method()
    except Exception:  # a broken _repr_ must not lose the work: the text form remains
        return None


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<{type(value).__qualname__} object: repr failed: {exc!r}>"
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def human_bytes(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``12.3 MiB``, ``2 GiB`` (the one size format; ``render.size``):
    a limit of ``8388608`` bytes reads ``8 MiB``, never as the raw number."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}".replace(".0 ", " ")
        value /= 1024
    return f"{value:.1f} TiB".replace(".0 ", " ")
