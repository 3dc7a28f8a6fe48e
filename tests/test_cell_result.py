"""A one-shot cell's result (issue 34): one contract for the runner that makes it and the magic
that reads it, and the same bytes on the wire as before it existed."""

from __future__ import annotations

import json

from gpulayer_kernel.contracts import SHOWN_KEY, CellResult, ShownValue

# What a worker wrote before the contract (runner.shown_value + _moved_value), byte for byte.
OLD_SHOWN = {
    SHOWN_KEY: "<Thing>",
    "type": "m.Thing",
    "why": "a Thing is not JSON",
    "display": {"data": {"text/plain": "<Thing>"}, "metadata": {}},
}


def test_a_json_value_travels_as_itself() -> None:
    for value in (None, 3, "x", [1, 2], {"a": 1}):
        result = CellResult(value=value)
        assert result.to_wire() == value
        assert CellResult.of_wire(value) == result


def test_a_shown_value_keeps_the_old_wire_shape() -> None:
    shown = ShownValue(
        text="<Thing>",
        type="m.Thing",
        why="a Thing is not JSON",
        display={"data": {"text/plain": "<Thing>"}, "metadata": {}},
    )
    assert json.dumps(CellResult(shown=shown).to_wire()) == json.dumps(OLD_SHOWN)
    with_artifact = CellResult(shown=shown.model_copy(update={"artifact": "cell-value.gpulayer"}))
    assert with_artifact.to_wire() == {**OLD_SHOWN, "artifact": "cell-value.gpulayer"}


def test_an_old_workers_dict_still_reads() -> None:
    result = CellResult.of_wire({**OLD_SHOWN, "refused": "too big", "refused_hint": "save it"})
    assert result.shown is not None and result.value is None
    assert (result.shown.text, result.shown.type) == ("<Thing>", "m.Thing")
    assert result.refused == "too big" and result.artifact is None
    # The fields it may lack, or send oddly, read as the magic always read them.
    sparse = CellResult.of_wire({SHOWN_KEY: "x", "type": 3, "display": "not a dict", "new": 1})
    assert sparse.shown == ShownValue(text="x", type="3")


def test_a_dict_that_only_looks_shown_is_a_value() -> None:
    odd = {SHOWN_KEY: 5, "type": "t"}
    assert CellResult.of_wire(odd) == CellResult(value=odd)
    assert CellResult.of_wire({"artifact": "x"}).artifact is None
