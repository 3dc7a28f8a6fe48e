"""Moving values between a kernel and a session without pickle: one safetensors file.

``%gpulayer push``/``pull`` and a cell's ``--in``/``--out`` (in a session or one-shot) carry
plain JSON as it is, and also torch tensors, numpy arrays and (nested) dicts, lists and tuples
of them. Those travel as a file in the `safetensors
<https://github.com/huggingface/safetensors>`_ format, written and read here without the
package: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
and byte range, then the raw bytes. The structure around the tensors (the dicts, lists, tuples,
JSON leaves, and which leaves are torch or numpy) is JSON in the header's ``__metadata__``.
Reading never runs code: nothing is unpickled, so a file from anywhere is safe to load. Anything
else — a function, a generator, an open file, a model object — is refused with an error that
names the path of the value and says what to do instead.

Tensors arrive on the CPU (``x.to(device)`` in the cell that needs them); bfloat16 and the other
torch dtypes keep their bytes exactly. numpy and torch are imported only when a value needs them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from typing import Any

from .display import human_bytes
from .errors import InvalidInput, NotJSON, TooLarge

MAX_ENV = "GPULAYER_MAX_TRANSFER_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: past it, an artifact (or the worker's disk) is the way
META_KEY = "gpulayer"
FORMAT = "gpulayer-transfer/1"
MAX_HEADER = 100 << 20

# safetensors dtype names ↔ torch dtypes (by attribute name) and numpy dtype strings.
_TORCH = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
    "C128": "complex128",
}
_NUMPY = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "|i1",
    "U8": "|u1",
    "U16": "<u2",
    "U32": "<u4",
    "U64": "<u8",
    "BOOL": "|b1",
    "C64": "<c8",
    "C128": "<c16",
}
ACCEPTS = (
    "JSON values (numbers, strings, booleans, None), torch tensors, numpy arrays, and "
    "dicts/lists/tuples of them"
)


# A one-shot cell's ``--in`` values JSON cannot carry travel in its bundle as this file; with
# ``--out`` (the runner sees ``OUT_ENV``), a last value JSON cannot carry comes back as this
# artifact.
CELL_INPUTS = "gpulayer-inputs.safetensors"
CELL_VALUE = "gpulayer-value.safetensors"
OUT_ENV = "GPULAYER_CELL_OUT"
KERNEL_AND_SESSION = "between the kernel and a session"


def max_bytes() -> int:
    try:
        return max(1, int(os.environ.get(MAX_ENV, "")))
    except ValueError:
        return DEFAULT_MAX_BYTES


MAX_ITEMS = 100_000  # values is_plain_json looks at before it says "not sure"
MAX_DEPTH = 200  # nesting encode follows (a structure deeper than this is refused)


def is_plain_json(value: Any) -> bool:
    """True when ``value`` is certainly JSON as it is (then it needs no blob at all). False
    means "not sure" past ``MAX_ITEMS`` values (a huge or self-containing structure), never
    "refused": ``encode`` and ``ensure_json`` own the rules and name the offending item."""
    stack = [value]
    count = 0
    while stack:
        v = stack.pop()
        count += 1
        if count > MAX_ITEMS:
            return False
        if v is None or type(v) in (bool, int, str):
            continue
        if type(v) is float:
            if not math.isfinite(v):
                return False
            continue
        if type(v) is list:
            stack.extend(v)
            continue
        if type(v) is dict and all(type(k) is str for k in v):
            stack.extend(v.values())
            continue
        return False
    return True


def refusal(value: Any, path: str, across: str = KERNEL_AND_SESSION) -> InvalidInput:
    """Why ``value`` (at ``path``) cannot be moved, with what to do instead."""
    import inspect
    import io

    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        what, hint = "a generator", "turn it into a list first (list(gen)), or create it there"
    elif isinstance(value, io.IOBase):
        what, hint = "an open file", "send the file itself with --files, or its contents"
    elif inspect.isroutine(value) or inspect.isclass(value) or inspect.ismodule(value):
        what = "code (a function, class or module)"
        hint = (
            "define it in the session: run the cell that defines it there, not in the kernel"
            if across == KERNEL_AND_SESSION
            else "define it in the cell, or import it from a file sent with --files"
        )
    elif hasattr(value, "state_dict") and callable(value.state_dict):
        what = f"a {kind} object"
        hint = "move its tensors instead (model.state_dict()), and build the object there"
    else:
        what = f"a {kind} object"
        hint = "convert it to those, or save it to $GPULAYER_OUTPUT and fetch it as an artifact"
    return NotJSON(
        f"{path} is {what}, which cannot move {across}; only {ACCEPTS} can (GPUlayer never "
        "pickles)",
        hint=hint,
        details={"path": path, "type": kind},
        code="not_transferable",
    )


def _too_large_hint(across: str) -> str:
    """How to move what is too large to move as a value, by where it was going."""
    if across.startswith("from "):  # a job's value back to the kernel: it writes a file there
        return (
            "move large data as files: write it to $GPULAYER_OUTPUT in the job and fetch the "
            f"artifact, or raise {MAX_ENV}"
        )
    if across == KERNEL_AND_SESSION:
        # Into a session, a file written in the kernel does not travel; out of one, it does.
        return (
            "move large data as files: load inputs from storage the session can read (or make "
            "them there), write outputs to $GPULAYER_OUTPUT in the session and fetch the "
            f"artifact; or raise {MAX_ENV}"
        )
    # --in of a one-shot job: its values and its --files ride in its bundle, which has a limit.
    from . import bundles  # here: job processes import this module, and seldom need this

    return (
        "move large data as files: save it to a file and send it with --files (the job reads it "
        "from its working directory; the bundle holds up to "
        f"{human_bytes(bundles.MAX_BUNDLE_BYTES)}), or have the job read it from storage its "
        "worker can reach"
    )


def encode(
    values: Mapping[str, Any], limit: int | None = None, across: str = KERNEL_AND_SESSION
) -> bytes:
    """``values`` (name → value) as one safetensors file; refuses what cannot move, naming it
    (``across`` says where to, in the error)."""
    limit = max_bytes() if limit is None else limit
    tensors: list[tuple[str, str, list[int], bytes]] = []
    total = 0
    inside: set[int] = set()  # the containers on the path being walked (a cycle is refused)

    def walk(v: Any, path: str) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                return {"$float": repr(v)}
            return v
        if isinstance(v, (list, tuple, dict)):
            if id(v) in inside or len(inside) >= MAX_DEPTH:
                why = "contains itself" if id(v) in inside else f"nests deeper than {MAX_DEPTH}"
                raise NotJSON(
                    f"{path} {why}, which cannot move {across}",
                    hint="move a flat structure of tensors and JSON values",
                    details={"path": path},
                    code="not_transferable",
                )
            inside.add(id(v))
            try:
                return container(v, path)
            finally:
                inside.discard(id(v))
        return leaf(v, path)

    def container(v: list[Any] | tuple[Any, ...] | dict[Any, Any], path: str) -> Any:
        if not isinstance(v, dict):
            items = [walk(x, f"{path}[{i}]") for i, x in enumerate(v)]
            return items if isinstance(v, list) else {"$tuple": items}
        if not all(isinstance(k, str) for k in v):
            raise NotJSON(
                f"{path} has a key that is not a string",
                hint="use string keys",
                details={"path": path},
                code="not_transferable",
            )
        mapping = {k: walk(x, f"{path}[{k!r}]") for k, x in v.items()}
        return {"$dict": mapping} if any(k.startswith("$") for k in v) else mapping

    def leaf(v: Any, path: str) -> Any:
        nonlocal total
        found = _tensor_leaf(v, path)
        if found is None:
            raise refusal(v, path, across)
        source, dtype, shape, raw = found
        total += len(raw)
        if total > limit:
            raise TooLarge(
                f"{path}: the values add up to more than the {human_bytes(limit)} limit of a move "
                f"{across} ({MAX_ENV})",
                hint=_too_large_hint(across),
                details={"limit": limit, "path": path},
                code="transfer_too_large",
            )
        name = f"t{len(tensors)}"
        tensors.append((name, dtype, shape, raw))
        return {"$tensor": name, "kind": source}

    tree = {name: walk(value, name) for name, value in values.items()}
    header: dict[str, Any] = {}
    offset = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header["__metadata__"] = {"format": FORMAT, META_KEY: json.dumps(tree, allow_nan=False)}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data to 8 bytes
    return struct.pack("<Q", len(head)) + head + b"".join(t[3] for t in tensors)


def _tensor_leaf(v: Any, path: str) -> tuple[str, str, list[int], bytes] | None:
    """(``torch``|``numpy``, dtype, shape, bytes) of a tensor or array; None for anything else."""
    mod = type(v).__module__.split(".")[0]
    if mod == "torch":
        import torch

        if not isinstance(v, torch.Tensor):
            return None
        if v.is_sparse or v.is_quantized or v.is_nested:
            raise NotJSON(
                f"{path} is a sparse, quantized or nested tensor; only dense tensors can move",
                hint="convert it (x.to_dense(), x.dequantize()) first",
                details={"path": path},
                code="not_transferable",
            )
        name = str(v.dtype).removeprefix("torch.")
        dtype = next((k for k, n in _TORCH.items() if n == name), None)
        if dtype is None:
            raise NotJSON(
                f"{path} has dtype {v.dtype}, which safetensors cannot carry",
                hint="convert it to a common dtype (x.float())",
                details={"path": path},
                code="not_transferable",
            )
        t = v.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return "torch", dtype, list(t.shape), raw
    if mod == "numpy":
        import numpy as np

        if isinstance(v, np.generic):
            v = np.asarray(v)
        if not isinstance(v, np.ndarray):
            return None
        # Not ascontiguousarray: it makes a 0-d array 1-d.
        arr = v if v.flags.c_contiguous else v.copy(order="C")
        want = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        dtype = next((k for k, s in _NUMPY.items() if np.dtype(s) == want), None)
        if dtype is None:
            raise NotJSON(
                f"{path} is a numpy array of dtype {arr.dtype}, which safetensors cannot carry",
                hint="convert it to a numeric dtype first (objects and strings cannot move)",
                details={"path": path},
                code="not_transferable",
            )
        return "numpy", dtype, list(arr.shape), arr.astype(want, copy=False).tobytes()
    return None


def decode(data: bytes) -> dict[str, Any]:
    """The values of a file written by :func:`encode` (no code runs: nothing is unpickled)."""
    if len(data) < 8:
        raise _bad("it is shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise _bad("its header length is out of range")
    try:
        header = json.loads(data[8 : 8 + n])
        tree = json.loads(header["__metadata__"][META_KEY])
    except (ValueError, KeyError, TypeError) as exc:
        raise _bad(f"its header is not GPUlayer's ({exc})") from None
    body = memoryview(data)[8 + n :]

    def tensor(ref: Mapping[str, Any]) -> Any:
        spec = header.get(ref["$tensor"])
        if not isinstance(spec, dict):
            raise _bad(f"it names a tensor {ref['$tensor']!r} it does not hold")
        start, end = spec["data_offsets"]
        if not 0 <= start <= end <= len(body):
            raise _bad("a tensor's bytes are out of range")
        shape = [int(s) for s in spec["shape"]]
        raw = bytes(body[start:end])
        if ref.get("kind") == "numpy":
            import numpy as np

            return (
                np.frombuffer(raw, dtype=np.dtype(_NUMPY[spec["dtype"]]))
                .reshape(tuple(shape))
                .copy()
            )
        import torch

        dtype = getattr(torch, _TORCH[spec["dtype"]])
        if not raw:
            return torch.empty(tuple(shape), dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(tuple(shape))

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            if "$tensor" in v:
                return tensor(v)
            if "$tuple" in v:
                return tuple(walk(x) for x in v["$tuple"])
            if "$float" in v:
                return float(v["$float"])
            if "$dict" in v:
                return {k: walk(x) for k, x in v["$dict"].items()}
            return {k: walk(x) for k, x in v.items()}
        return v

    if not isinstance(tree, dict):
        raise _bad("its structure is not a mapping of names")
    return {str(k): walk(v) for k, v in tree.items()}


def _bad(why: str) -> InvalidInput:
    return InvalidInput(
        f"not a GPUlayer transfer file: {why}",
        hint="it was not written by gpulayer_kernel.transfer.encode",
        code="transfer_invalid",
    )


def nbytes(value: Any) -> int:
    """Roughly how many bytes ``value`` is (tensors and arrays exactly; the rest as JSON)."""
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.element_size() * value.numel())
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return len(repr(value))
