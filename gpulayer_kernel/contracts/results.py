"""A one-shot cell's result as it travels from the job to the kernel (``Job.result``).

A ``%%gpulayer`` cell's result is one of:

- **a value**: its last expression (or ``job.result(...)``) when JSON carries it, sent as that
  JSON value, unwrapped;
- **a shown value**: one JSON cannot carry, sent as its display, made on the worker as a session
  cell's is (its MIME bundle, and its text form), marked by the key :data:`SHOWN_KEY`. With
  ``--out`` it also names the tensor-safe **artifact** the kernel assigns from, or says why the
  value was **refused** (the magic says so, and shows it).

``job/runner.py`` makes one (:meth:`CellResult.to_wire`), ``jupyter/magics.py`` reads one
(:meth:`CellResult.of_wire`). The wire shape is the dict workers sent before this contract
existed (``{"gpulayer/shown": text, "type", "why", "display", "artifact" | "refused",
"refused_hint"}``), so a result from an older worker still reads, and an older kernel still reads
a newer worker's.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import ConfigDict, Field, ValidationError

from ._base import Contract

SHOWN_KEY: Final = "gpulayer/shown"  # marks a cell result that is the display of a value


class ShownValue(Contract):
    """A cell's last value JSON could not carry, as the notebook shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, populate_by_name=True)

    text: str = Field(alias=SHOWN_KEY, description="its text form (bounded)")
    type: str = Field("object", description="its type, module.qualname")
    why: str = Field("", description="why JSON could not carry it")
    display: dict[str, Any] | None = Field(
        None, description="its MIME bundle: {data: {mime: content}, metadata}"
    )
    artifact: str | None = Field(None, description="--out: the artifact holding it, tensor-safe")
    refused: str | None = Field(None, description="--out: why it could not travel even so")
    refused_hint: str | None = None


class CellResult(Contract):
    """A one-shot cell's result: a JSON ``value``, or a ``shown`` value (see the module)."""

    value: Any = None
    shown: ShownValue | None = None

    @property
    def artifact(self) -> str | None:
        return self.shown.artifact if self.shown is not None else None

    @property
    def refused(self) -> str | None:
        return self.shown.refused if self.shown is not None else None

    def to_wire(self) -> Any:
        """What the job writes as its result: the value itself, or the shown value's dict."""
        if self.shown is None:
            return self.value
        return self.shown.model_dump(by_alias=True, exclude={"api_version"}, exclude_none=True)

    @classmethod
    def of_wire(cls, raw: Any) -> CellResult:
        """Read a job's result. A dict that only looks like a shown value (a user's own dict
        with the key, or a malformed one) is a plain value, as it always was."""
        if isinstance(raw, dict) and isinstance(raw.get(SHOWN_KEY), str):
            try:
                return cls(shown=ShownValue.model_validate(_lenient(raw)))
            except ValidationError:
                pass
        return cls(value=raw)


def _lenient(raw: dict[str, Any]) -> dict[str, Any]:
    """An older worker's dict as the contract reads it: the fields it knows; ``type`` as text and
    a ``display`` that is not a dict dropped, as the magic always read them."""
    known = {SHOWN_KEY, *ShownValue.model_fields} - {"text", "api_version"}
    out = {k: v for k, v in raw.items() if k in known}
    if "type" in out:
        out["type"] = str(out["type"])
    if not isinstance(out.get("display"), dict):
        out.pop("display", None)
    return out
