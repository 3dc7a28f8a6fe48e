"""Values between kernel and session without pickle: one safetensors file, exact; the rest is
refused by name."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer_kernel import transfer
from gpulayer_kernel.errors import InvalidInput, NotJSON, TooLarge

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and type(a) is type(b)


tensors = st.builds(
    lambda shape, dtype, seed: (torch.arange(math.prod(shape)).reshape(shape) * seed).to(dtype),
    st.lists(st.integers(0, 4), max_size=3),
    st.sampled_from(DTYPES),
    st.integers(-3, 3),
)
arrays = st.builds(
    lambda shape, dtype: np.arange(math.prod(shape)).reshape(shape).astype(dtype),
    st.lists(st.integers(0, 4), max_size=3),
    st.sampled_from(["<f4", "<f8", "<i8", "|u1", "|b1", "<i2"]),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    tensors,
    arrays,
)
trees = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.tuples(kids, kids),
        st.dictionaries(st.text(max_size=8), kids, max_size=4),
    ),
    max_leaves=12,
)


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), trees, max_size=4))
def test_every_value_comes_back_exactly(values: dict[str, Any]) -> None:
    assert _same(values, transfer.decode(transfer.encode(values)))


def test_bfloat16_keeps_its_bits_and_the_file_is_real_safetensors() -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    x = torch.randn(5, 7).to(torch.bfloat16)
    data = transfer.encode({"x": x, "meta": {"step": 3}})
    assert torch.equal(transfer.decode(data)["x"], x)
    # Any safetensors reader sees the tensor (our structure rides in the header's metadata).
    assert torch.equal(safetensors_torch.load(data)["t0"], x)


def test_tensors_come_back_on_the_cpu_contiguous() -> None:
    x = torch.arange(12.0).reshape(3, 4).t()  # not contiguous
    out = transfer.decode(transfer.encode({"x": x}))["x"]
    assert out.is_contiguous() and out.device.type == "cpu" and torch.equal(out, x)


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (lambda: 1, "code"),
        ((i for i in range(3)), "a generator"),
        (io.StringIO("x"), "an open file"),
        (object(), "object"),
        (torch.nn.Linear(2, 2), "state_dict"),
    ],
    ids=["lambda", "generator", "file", "object", "module"],
)
def test_what_cannot_move_is_refused_naming_its_path(value: Any, what: str) -> None:
    with pytest.raises(NotJSON) as err:
        transfer.encode({"batch": {"items": [1, value]}})
    assert err.value.code == "not_transferable"
    assert "batch['items'][1]" in err.value.message
    assert "never pickles" in err.value.message
    assert what in err.value.message + err.value.hint


def test_past_the_size_limit_the_error_points_to_artifacts() -> None:
    with pytest.raises(TooLarge) as err:
        transfer.encode({"x": torch.zeros(1000)}, limit=1000)
    assert err.value.code == "transfer_too_large"
    assert "artifact" in err.value.hint


@pytest.mark.parametrize(
    "data", [b"", b"\x00" * 8, b"\xff" * 16, transfer.encode({"x": 1})[:-3] + b"{{{"]
)
def test_garbage_is_not_a_transfer_file(data: bytes) -> None:
    with pytest.raises(InvalidInput) as err:
        transfer.decode(data)
    assert err.value.code == "transfer_invalid"


def test_plain_json_needs_no_blob() -> None:
    assert transfer.is_plain_json({"a": [1, 2.5, None, "x", {"b": True}]})
    assert not transfer.is_plain_json({"a": float("nan")})
    assert not transfer.is_plain_json((1, 2))
    assert not transfer.is_plain_json(torch.zeros(1))


def test_a_structure_that_contains_itself_is_refused_not_followed_forever() -> None:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    assert not transfer.is_plain_json(loop)  # "not sure": bounded, never a hang
    with pytest.raises(NotJSON) as err:
        transfer.encode({"loop": loop})
    assert err.value.code == "not_transferable"
    assert err.value.message.startswith("loop[1]['back'] contains itself")
    deep: list[Any] = []
    for _ in range(transfer.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(NotJSON, match=f"nests deeper than {transfer.MAX_DEPTH}"):
        transfer.encode({"deep": deep})
    # The same list twice, side by side, is not a cycle.
    shared = [1.0, 2.0]
    assert transfer.decode(transfer.encode({"pair": [shared, shared]})) == {
        "pair": [[1.0, 2.0], [1.0, 2.0]]
    }
