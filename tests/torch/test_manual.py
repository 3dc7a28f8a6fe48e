"""Manual optimization in one process: several optimizers, Lightning's calls, and its limits.

The 2-rank case (gradients averaged at each ``opt.step()``) is in test_strategies.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from gpulayer_kernel.torch import (  # noqa: E402
    ManualOptimizationInvalid,
    Module,
    OptimizersInvalid,
    Trainer,
    TrainerConfig,
    TrainingStepInvalid,
)

from .conftest import batches  # noqa: E402
from .torchrun_strategies import GAN  # noqa: E402

pytestmark = pytest.mark.torch


class TwoRates(Module):
    """Separate learning rates for two parts, stepped by hand; returns nothing."""

    automatic_optimization = False

    def __init__(self, returns: Any = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)
        self.returns = returns
        self.seen: list[Any] = []

    def training_step(self, batch: Any) -> Any:
        x, y = batch
        body, head = self.optimizers()
        self.seen.append((type(self.optimizers()).__name__, self.lr_schedulers()))
        loss = F.mse_loss(self.head(self.body(x)), y)
        body.zero_grad()
        head.zero_grad()
        self.manual_backward(loss)
        body.step()
        head.step()
        for scheduler in self.lr_schedulers():
            scheduler.step()
        return self.returns

    def configure_optimizers(self) -> Any:
        body = torch.optim.SGD(self.body.parameters(), lr=0.1)
        head = torch.optim.SGD(self.head.parameters(), lr=0.01)
        return [body, head], [
            torch.optim.lr_scheduler.StepLR(body, 1, gamma=0.5),
            {"scheduler": torch.optim.lr_scheduler.StepLR(head, 1, gamma=0.5)},
        ]


def test_a_gan_steps_both_optimizers_and_resumes_exactly(single_process: Path) -> None:
    data = batches(32, 4)
    whole = GAN()
    done = Trainer(max_steps=6, log_every=2, loggers=[]).fit(whole, data)
    assert done.step == 6 and done.metrics["loss"] is not None  # the returned g_loss
    saved = torch.load(done.checkpoint, weights_only=True)
    assert len(saved["optimizers"]) == 2

    first = GAN()
    cfg = TrainerConfig(max_steps=3, log_every=2, checkpoint_dir=str(single_process / "a"))
    half = Trainer(cfg, loggers=[]).fit(first, data)
    resumed = GAN()
    Trainer(max_steps=6, log_every=2, loggers=[], checkpoint_dir=str(single_process / "b")).fit(
        resumed, data, resume=half.checkpoint
    )
    for key, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_separate_learning_rates_and_schedulers_stepped_by_hand(single_process: Path) -> None:
    model = TwoRates()
    result = Trainer(max_steps=2, log_every=1, loggers=[]).fit(model, batches(16, 4))
    assert result.metrics["loss"] is None, "nothing returned: no loss to show"
    assert model.seen[0][0] == "list" and len(model.seen[0][1]) == 2
    assert model._gl_manual is None, "the module forgets the fit's optimizers once it ends"
    saved = torch.load(result.checkpoint, weights_only=True)
    assert [g["param_groups"][0]["lr"] for g in saved["optimizers"]] == [0.025, 0.0025]
    assert [s["last_epoch"] for s in saved["schedulers"]] == [2, 2]
    # resumed, the schedulers go on from where they were (step 3 halves the rates once more)
    again = TwoRates()
    more = Trainer(max_steps=3, log_every=1, loggers=[], checkpoint_dir=str(single_process / "r"))
    resumed = more.fit(again, batches(16, 4), resume=result.checkpoint)
    saved = torch.load(resumed.checkpoint, weights_only=True)
    assert [g["param_groups"][0]["lr"] for g in saved["optimizers"]] == [0.0125, 0.00125]


def test_what_manual_optimization_cannot_do_is_refused_up_front(single_process: Path) -> None:
    for fields, named in (
        ({"accumulate": 2}, "accumulate"),
        ({"grad_clip": 1.0}, "grad_clip"),
        ({"strategy": "fsdp"}, "strategy"),
    ):
        with pytest.raises(ManualOptimizationInvalid) as caught:
            Trainer(max_steps=1, loggers=[], **fields).fit(GAN(), batches(8, 4))
        assert caught.value.details["field"] == named and named in caught.value.message
        assert caught.value.hint
    with pytest.raises(TrainingStepInvalid, match="may return None or a scalar tensor"):
        Trainer(max_steps=1, loggers=[]).fit(TwoRates(returns={"loss": 1}), batches(8, 4))
    with pytest.raises(ManualOptimizationInvalid, match="inside training_step") as outside:
        GAN().optimizers()
    assert "automatic_optimization = False" in outside.value.hint


def test_two_optimizers_without_manual_optimization_point_to_it(single_process: Path) -> None:
    class Automatic(TwoRates):
        automatic_optimization = True

    with pytest.raises(OptimizersInvalid) as caught:
        Trainer(max_steps=1, loggers=[]).fit(Automatic(), batches(8, 4))
    assert "automatic_optimization = False" in caught.value.hint


def test_ddp_options_and_sharded_checkpoints_are_checked_in_the_config() -> None:
    with pytest.raises(ValidationError, match="DDP options"):
        TrainerConfig(max_steps=1, strategy="fsdp", find_unused_parameters=True)
    with pytest.raises(ValidationError, match="set strategy='fsdp'"):
        TrainerConfig(max_steps=1, checkpoint_format="sharded")
    with pytest.raises(ValidationError, match="strategy"):
        TrainerConfig(max_steps=1, strategy="deepspeed")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="use 'bf16-mixed'"):
        TrainerConfig(max_steps=1, strategy="fsdp", precision="16-mixed")
    assert TrainerConfig(max_steps=1, static_graph=True).static_graph


def test_fsdp_in_one_process_trains_unwrapped(single_process: Path) -> None:
    from .conftest import tiny

    plain, sharded = tiny(), tiny()
    a = Trainer(max_steps=3, loggers=[]).fit(plain, batches())
    b = Trainer(max_steps=3, loggers=[], strategy="fsdp").fit(sharded, batches())
    assert a.metrics["loss"] == b.metrics["loss"]
    assert all(torch.equal(v, sharded.state_dict()[k]) for k, v in plain.state_dict().items())
