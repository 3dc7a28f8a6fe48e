"""The base of every contract: versioned, frozen, and strict about unknown fields."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..display import human_bytes
from ..errors import NotJSON, ValidationFailed

API_VERSION: Final = "gpulayer/v1"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
SHA256_RE = re.compile(SHA256_PATTERN)

# Results and arguments travel as JSON; anything bigger belongs in an artifact.
MAX_JSON_BYTES = 1 << 20


class Contract(BaseModel):
    """A versioned wire contract. Contracts only grow: add fields, never change old meanings."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    api_version: Literal["gpulayer/v1"] = API_VERSION


T = TypeVar("T", bound=Contract)


def built(cls: type[T], fields: dict[str, Any]) -> T:
    """A contract made as ``model_construct`` makes it (unchecked: every part was checked or made
    by us), at a fifth of its cost: chatty jobs make millions of log lines and records. ``fields``
    are every field but ``api_version``, in the class's order; all count as set."""
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", {"api_version": API_VERSION, **fields})
    object.__setattr__(obj, "__pydantic_fields_set__", set(fields))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def parse(cls: type[T], data: Any) -> T:
    """Validate ``data`` as ``cls``; a failure names the field at fault (``resources.gpus``)."""
    try:
        if isinstance(data, (str, bytes)):
            return cls.model_validate_json(data)
        return cls.model_validate(data)
    except ValidationError as exc:
        raise validation_error(cls.__name__, exc) from None


def validation_error(what: str, exc: ValidationError) -> ValidationFailed:
    problems = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        problems.append({"field": loc, "problem": msg})
    first = problems[0] if problems else {"field": "(root)", "problem": "invalid"}
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return ValidationFailed(
        f"invalid {what}: {first['field']}: {first['problem']}{more}",
        hint="check the field names and types against the JSON Schema in "
        "gpulayer_kernel/contracts/schema.json",
        details={"errors": problems},
    )


def ensure_json(value: Any, what: str = "value") -> Any:
    """Check that ``value`` is plain JSON (dict/list/str/int/float/bool/None) and return it.

    GPUlayer never pickles: arguments and results cross machines as JSON. Anything else (a
    tensor, a function, a NaN) is refused with the path of the first offending item.
    """
    _check_json(value, what, set())
    size = len(json.dumps(value, allow_nan=False))
    if size > MAX_JSON_BYTES:
        raise NotJSON(
            f"{what} is {human_bytes(size)} of JSON; the limit is {human_bytes(MAX_JSON_BYTES)}",
            hint="write large data to a file in $GPULAYER_OUTPUT (an artifact) and pass its name",
            details={"path": what, "bytes": size},
        )
    return value


MAX_JSON_DEPTH = 200  # nesting ensure_json follows; deeper (or a cycle) is refused, not a crash


def _check_json(value: Any, path: str, inside: set[int]) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSON(
                f"{path} is {value}, which JSON cannot carry",
                hint="use None or a string for non-finite numbers",
                details={"path": path},
            )
        return
    if isinstance(value, (list, tuple, dict)):
        if id(value) in inside or len(inside) >= MAX_JSON_DEPTH:
            why = (
                "contains itself" if id(value) in inside else f"nests deeper than {MAX_JSON_DEPTH}"
            )
            raise NotJSON(
                f"{path} {why}, which JSON cannot carry",
                hint="pass a flat structure of plain JSON values",
                details={"path": path},
            )
        inside.add(id(value))
        try:
            _check_items(value, path, inside)
        finally:
            inside.discard(id(value))
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise NotJSON(
        f"{path} is a {kind}, which is not JSON; GPUlayer never pickles",
        hint="pass plain JSON (numbers, strings, lists, dicts); for tensors, arrays or files, save "
        "them to $GPULAYER_OUTPUT as an artifact and pass the artifact's name instead",
        details={"path": path, "type": kind},
    )


def _check_items(
    value: list[Any] | tuple[Any, ...] | dict[Any, Any], path: str, inside: set[int]
) -> None:
    if not isinstance(value, dict):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]", inside)
        return
    for key, item in value.items():
        if not isinstance(key, str):
            raise NotJSON(
                f"{path} has a key of type {type(key).__name__}; JSON keys are strings",
                hint="convert the keys to str",
                details={"path": path},
            )
        _check_json(item, f"{path}[{key!r}]", inside)
