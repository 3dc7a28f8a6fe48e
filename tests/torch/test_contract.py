"""The Module contract is checked up front: each wrong return gets its own code, method and hint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from gpulayer_kernel.errors import GPUlayerError, InvalidInput  # noqa: E402
from gpulayer_kernel.torch import (  # noqa: E402
    NoTrainingData,
    OptimizersInvalid,
    SchedulerUnsupported,
    Trainer,
    TrainerConfig,
    TrainingStepInvalid,
    ValidationStepInvalid,
    distributed_loader,
)
from gpulayer_kernel.torch.testing import TinyRegressor, regression_data  # noqa: E402

pytestmark = pytest.mark.torch

Returns = Callable[[Any], Any]  # loss -> what the hook returns
Setup = Callable[[Any], Any]  # module -> what configure_optimizers returns


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID", "GPULAYER_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_OUTPUT", str(tmp_path / "output"))


class Bent(TinyRegressor):
    """A TinyRegressor whose hooks return whatever a test hands it."""

    def __init__(
        self,
        returns: Returns | None = None,
        setup: Setup | None = None,
        validation: Returns | None = None,
    ) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.returns, self.setup, self.validation = returns, setup, validation

    def training_step(self, batch: Any) -> Any:
        loss = super().training_step(batch)
        return self.returns(loss) if self.returns else loss

    def configure_optimizers(self) -> Any:
        return self.setup(self) if self.setup else super().configure_optimizers()

    def validation_step(self, batch: Any) -> Any:
        metrics = super().validation_step(batch)
        return self.validation(metrics["loss"]) if self.validation else metrics


def fit(model: Bent, tmp_path: Path, loader: Any = None, **config: Any) -> Any:
    val_loader = config.pop("val_loader", None)
    config = {"max_steps": 4, "checkpoint_dir": str(tmp_path / "ckpt"), **config}
    loader = loader if loader is not None else DataLoader(regression_data(32), batch_size=8)
    return Trainer(TrainerConfig(**config)).fit(model, loader, val_loader)


def refused(model: Bent, tmp_path: Path, error: type[GPUlayerError], **kw: Any) -> GPUlayerError:
    """Fit ``model`` expecting ``error``; check that nothing was trained or saved first."""
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(error) as caught:
        fit(model, tmp_path, **kw)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not (tmp_path / "ckpt").exists()
    assert isinstance(caught.value, InvalidInput)  # one hierarchy: the CLI and API render it
    assert caught.value.hint
    return caught.value


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def step_lr(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)


# --- training_step ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returns", "returned", "hint"),
    [
        pytest.param(lambda loss: None, "returned None", "missing return", id="None"),
        pytest.param(lambda loss: loss.item(), "returned a float (", ".item()", id="float"),
        pytest.param(
            lambda loss: loss.expand(8, 1), "tensor of shape (8, 1)", "loss.mean()", id="non-scalar"
        ),
        pytest.param(
            lambda loss: {"loss": loss, "log": {}},
            "returned {'loss': Tensor, 'log': {}}",
            "return out['loss']",
            id="lightning-dict",
        ),
        pytest.param(lambda loss: (loss, 1), "returned (Tensor, int)", "scalar loss", id="tuple"),
        pytest.param(
            lambda loss: loss.detach(), "does not require grad", "no .detach()", id="detached"
        ),
        pytest.param(
            lambda loss: torch.tensor(3), "a torch.int64 tensor", "autograd on", id="int-tensor"
        ),
    ],
)
def test_training_step_must_return_a_scalar_loss_tensor(
    tmp_path: Path, returns: Returns, returned: str, hint: str
) -> None:
    error = refused(Bent(returns=returns), tmp_path, TrainingStepInvalid)
    assert error.code == "training_step_invalid"
    assert "Bent.training_step returned" in error.message and returned in error.message
    assert hint in error.hint
    assert error.details["method"] == "training_step"


def test_a_one_element_loss_is_accepted(tmp_path: Path) -> None:
    result = fit(Bent(returns=lambda loss: loss.reshape(1, 1)), tmp_path)
    assert result.step == 4 and result.metrics["loss"] is not None


def test_training_step_is_checked_on_its_first_call_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_kernel.torch import run as trainer

    calls = []
    original = trainer.check_training_step

    def counted(value: Any, module: Any) -> Any:
        calls.append(value)
        return original(value, module)

    monkeypatch.setattr(trainer, "check_training_step", counted)
    model = Bent()
    fit(model, tmp_path, max_steps=12, accumulate=2)
    assert model.calls == 24 and len(calls) == 1  # 24 calls of training_step, one check


# --- configure_optimizers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "returned", "hint"),
    [
        pytest.param(lambda m: None, "returned None", "return the optimizer, or", id="None"),
        pytest.param(lambda m: [sgd(m)], "returned [SGD]", "the optimizer itself", id="[opt]"),
        pytest.param(
            lambda m: ([o := sgd(m)], [step_lr(o)]),
            "returned ([SGD], [StepLR])",
            "return (optimizer, scheduler); the Trainer steps the scheduler after every",
            id="([opt],[sched])",
        ),
        pytest.param(
            lambda m: ([o := sgd(m)], [{"scheduler": step_lr(o), "interval": "step"}]),
            "returned ([SGD], [{'scheduler': StepLR, 'interval': str}])",
            "return (optimizer, scheduler)",
            id="([opt],[config])",
        ),
        pytest.param(
            lambda m: (sgd(m), sgd(m)), "returned (SGD, SGD)", "one optimizer", id="two-optimizers"
        ),
        pytest.param(
            lambda m: (sgd(m), "cosine"), "returned (SGD, str)", "(optimizer, scheduler)", id="str"
        ),
        pytest.param(
            lambda m: (sgd(m), step_lr(sgd(m))),
            "StepLR built on another optimizer",
            "the optimizer you return",
            id="foreign-scheduler",
        ),
    ],
)
def test_configure_optimizers_must_return_an_optimizer_or_a_pair(
    tmp_path: Path, setup: Setup, returned: str, hint: str
) -> None:
    error = refused(Bent(setup=setup), tmp_path, OptimizersInvalid)
    assert error.code == "configure_optimizers_invalid"
    assert "Bent.configure_optimizers returned" in error.message
    assert returned in error.message
    assert hint in error.hint


@pytest.mark.parametrize(
    "setup",
    [
        pytest.param(
            lambda m: ((o := sgd(m)), torch.optim.lr_scheduler.ReduceLROnPlateau(o)), id="pair"
        ),
    ],
)
def test_reduce_lr_on_plateau_without_a_monitor_is_refused_before_training(
    tmp_path: Path, setup: Setup
) -> None:
    error = refused(Bent(setup=setup), tmp_path, SchedulerUnsupported)
    assert error.code == "scheduler_unsupported"
    assert "Bent.configure_optimizers returned" in error.message
    assert "ReduceLROnPlateau" in error.message and "CosineAnnealingLR" in error.hint


def test_an_optimizer_with_no_scheduler_is_accepted(tmp_path: Path) -> None:
    assert fit(Bent(setup=lambda m: (sgd(m), None)), tmp_path).step == 4


# --- validation_step ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("validation", "returned"),
    [
        pytest.param(lambda loss: None, "returned None", id="None"),
        pytest.param(lambda loss: loss, "returned a tensor of shape ()", id="tensor"),
        pytest.param(lambda loss: {"loss": loss.item()}, "{'loss': a float (", id="float-value"),
        pytest.param(
            lambda loss: {"loss": loss.expand(3)}, "{'loss': a tensor of shape (3,)}", id="vector"
        ),
    ],
)
def test_validation_step_must_return_a_dict_of_scalar_tensors(
    tmp_path: Path, validation: Returns, returned: str
) -> None:
    val = DataLoader(regression_data(16, seed=1), batch_size=8)
    with pytest.raises(ValidationStepInvalid) as caught:
        fit(Bent(validation=validation), tmp_path, val_loader=val, val_every=1)
    error = caught.value
    assert error.code == "validation_step_invalid"
    assert "Bent.validation_step returned" in error.message and returned in error.message
    assert "{'loss': loss" in error.hint


# --- the data -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loader",
    [
        pytest.param(
            DataLoader(regression_data(32), batch_size=64, drop_last=True), id="DataLoader"
        ),
        pytest.param(
            distributed_loader(regression_data(32), batch_size=64, drop_last=True),
            id="distributed_loader",
        ),
    ],
)
@pytest.mark.parametrize("length", [{"max_steps": 4}, {"max_steps": None, "max_epochs": 2}])
def test_a_batch_larger_than_the_dataset_with_drop_last_is_refused(
    tmp_path: Path, loader: Any, length: dict[str, int | None]
) -> None:
    error = refused(Bent(), tmp_path, NoTrainingData, loader=loader, **length)
    assert error.code == "no_training_data"
    assert "train_loader has no batches: batch_size 64 is larger than its 32 samples" in (
        error.message
    )
    assert "batch_size <= 32" in error.hint and "drop_last=False" in error.hint


def test_a_batch_larger_than_the_dataset_without_drop_last_still_trains(tmp_path: Path) -> None:
    loader = DataLoader(regression_data(32), batch_size=64)  # one partial batch per epoch
    assert fit(Bent(), tmp_path, loader=loader, max_steps=3).step == 3


def test_too_few_batches_for_one_accumulated_step_is_refused(tmp_path: Path) -> None:
    loader = DataLoader(regression_data(32), batch_size=16)  # 2 batches per epoch
    error = refused(
        Bent(), tmp_path, NoTrainingData, loader=loader, max_steps=None, max_epochs=1, accumulate=4
    )
    assert "max_epochs=1 of 2 batch(es)" in error.message and "accumulate=4" in error.message


class Stream(IterableDataset[Any]):
    """An IterableDataset without a length: its DataLoader is Sized but len() raises."""

    def __iter__(self) -> Any:
        return iter(regression_data(32))


def test_a_loader_without_a_length_trains_by_epochs(tmp_path: Path) -> None:
    result = fit(Bent(), tmp_path, DataLoader(Stream(), batch_size=8), max_steps=None, max_epochs=2)
    assert (result.step, result.epoch) == (8, 2)
