"""TrainerConfig: exactly one length, bounded numbers, no unknown fields, frozen, JSON."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from pydantic import ValidationError

from gpulayer_kernel.torch import TrainerConfig

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("kwargs", "given"),
    [({}, "neither"), ({"max_steps": 10, "max_epochs": 2}, "both")],
)
def test_exactly_one_of_max_steps_and_max_epochs(kwargs: dict[str, int], given: str) -> None:
    with pytest.raises(ValidationError, match=f"exactly one of max_steps or max_epochs \\({given}"):
        TrainerConfig(**kwargs)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_steps", 0),
        ("accumulate", 0),
        ("log_every", -1),
        ("grad_clip", 0.0),
        ("checkpoint_every", 0),
        ("keep_checkpoints", 0),
        ("precision", "64"),
        ("precision", "bf16"),
    ],
)
def test_bad_values_name_their_field(field: str, value: object) -> None:
    kwargs = {"max_epochs": 1, field: value} if field != "max_steps" else {field: value}
    with pytest.raises(ValidationError) as caught:
        TrainerConfig(**kwargs)  # type: ignore[arg-type]
    assert caught.value.errors()[0]["loc"][0] == field


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TrainerConfig(max_steps=1, accumulation=4)  # type: ignore[call-arg]


def test_frozen_and_json_round_trip() -> None:
    config = TrainerConfig(max_steps=100, precision="bf16-mixed", accumulate=4, grad_clip=1.0)
    with pytest.raises(ValidationError, match="frozen"):
        config.accumulate = 2  # type: ignore[misc]
    dumped = config.model_dump(mode="json")
    assert json.loads(json.dumps(dumped)) == dumped  # plain JSON, as stored in checkpoints
    assert TrainerConfig.model_validate(dumped) == config
    assert dumped["api_version"] == "gpulayer/v1"
