"""Display data as Jupyter has it, bounded: a payload past its limit is cut with a note, never an
error; secrets are masked in its text; a one-shot cell's value gets the same MIME bundle."""

from __future__ import annotations

import json
from typing import Any

from gpulayer_kernel import display


def test_a_display_within_the_limit_is_untouched() -> None:
    d = display.content({"text/plain": "x", "image/png": "AAAA"}, {"image/png": {"width": 3}})
    assert display.bound(d, 10_000) is d


def test_past_the_limit_the_largest_entry_goes_and_the_text_says_so() -> None:
    d = display.content({"text/plain": "<Figure>", "image/png": "A" * 50_000, "text/html": "<b/>"})
    cut = display.bound(d, 10_000)
    assert "image/png" not in cut["data"] and cut["data"]["text/html"] == "<b/>"
    text = cut["data"]["text/plain"]
    assert text.startswith("<Figure>") and "image/png (48.8 KiB)" in text and "artifact" in text
    assert len(json.dumps(cut)) <= 10_000


def test_a_text_past_the_limit_is_cut_with_a_count() -> None:
    cut = display.bound(display.content({"text/plain": "y" * 100_000}), 5_000)
    text = cut["data"]["text/plain"]
    assert "more characters" in text and len(json.dumps(cut)) <= 5_000


def test_secrets_are_masked_in_text_entries_only() -> None:
    d = display.content(
        {"text/plain": "key=S3CRET", "text/html": "<i>S3CRET</i>", "image/png": "S3CRET"}
    )
    masked = display.redact(d, lambda s: s.replace("S3CRET", "***"))
    assert masked["data"] == {
        "text/plain": "key=***",
        "text/html": "<i>***</i>",
        "image/png": "S3CRET",
    }


class Rich:
    def _repr_html_(self) -> str:
        return "<table><tr><td>1</td></tr></table>"

    def _repr_png_(self) -> bytes:
        return b"\x89PNG"

    def __repr__(self) -> str:
        return "Rich()"


class Broken:
    def _repr_html_(self) -> str:
        raise RuntimeError("nope")

    def __repr__(self) -> str:
        raise ValueError("no repr either")


def test_a_value_is_formatted_as_ipython_would_without_ipython() -> None:
    d = display.format_value(Rich())
    assert d["data"]["text/plain"] == "Rich()"
    assert d["data"]["text/html"].startswith("<table>")
    assert d["data"]["image/png"] == "iVBORw=="  # base64


def test_broken_reprs_never_lose_the_value() -> None:
    d = display.format_value(Broken())
    assert "repr failed" in d["data"]["text/plain"] and "text/html" not in d["data"]


def test_text_of_says_what_a_display_holds() -> None:
    assert display.text_of(display.content({"image/png": "x"})) == "<display: image/png>"
    assert display.text_of(None) == ""
    clear: dict[str, Any] = display.content({display.CLEAR: {"wait": True}})
    assert display.text_of(clear) == ""
