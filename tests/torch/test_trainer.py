"""The Trainer in one process: accumulation, resume, NaN, precision, validation, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from gpulayer_kernel.errors import InvalidInput  # noqa: E402
from gpulayer_kernel.torch import (  # noqa: E402
    CheckpointInvalid,
    LossNotFinite,
    Module,
    NoTrainingData,
    PrecisionUnsupported,
    Trainer,
    TrainerConfig,
    distributed_loader,
    load_checkpoint,
)
from gpulayer_kernel.torch.testing import TinyRegressor, regression_data  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID", "GPULAYER_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_OUTPUT", str(tmp_path / "output"))


def fit(model: Module, loader: Any, tmp_path: Path, val_loader: Any = None, **config: Any) -> Any:
    config.setdefault("checkpoint_dir", str(tmp_path / "ckpt"))
    return Trainer(TrainerConfig(**config)).fit(model, loader, val_loader)


def tiny(**kwargs: Any) -> TinyRegressor:
    torch.manual_seed(0)  # the same initial weights for every model a test compares
    return TinyRegressor(**kwargs)


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module, exact: bool) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        if exact:
            assert torch.equal(x, y), name
        else:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("grad_clip", [None, 0.05])
def test_accumulating_k_micro_batches_equals_one_k_times_batch(
    tmp_path: Path, grad_clip: float | None
) -> None:
    data = regression_data(96)
    accumulated, whole = tiny(), tiny()
    fit(
        accumulated,
        DataLoader(data, batch_size=4),
        tmp_path,
        max_steps=5,
        accumulate=4,
        grad_clip=grad_clip,
        log_every=2,
    )
    fit(whole, DataLoader(data, batch_size=16), tmp_path, max_steps=5, grad_clip=grad_clip)
    assert_same_parameters(accumulated, whole, exact=False)
    assert not torch.equal(accumulated.net[0].weight, tiny().net[0].weight)  # it did train


def make_loader(kind: str) -> Any:
    data = regression_data(40)
    if kind == "distributed_loader":  # skips consumed batches by index
        return distributed_loader(data, batch_size=4, shuffle=True, seed=3)
    if kind == "DataLoader(shuffle=True)":  # skips by loading and dropping
        return DataLoader(data, batch_size=4, shuffle=True)
    return [data[i : i + 4] for i in range(0, 40, 4)]  # a plain list of batches


@pytest.mark.parametrize("kind", ["distributed_loader", "DataLoader(shuffle=True)", "list"])
@pytest.mark.parametrize("stop_at", [7, 10])  # mid-epoch, and exactly at an epoch's end
def test_resume_continues_bit_for_bit(tmp_path: Path, kind: str, stop_at: int) -> None:
    # Dropout, AdamW and a scheduler: every RNG stream and every piece of state must come back.
    knobs = {"dropout": 0.2, "optimizer": "adamw", "lr": 0.01, "scheduler": True}
    config = {"max_steps": 12, "accumulate": 2, "log_every": 3, "keep_checkpoints": 10}
    straight = tiny(**knobs)
    fit(straight, make_loader(kind), tmp_path / "a", checkpoint_every=stop_at, **config)
    saved = tmp_path / "a" / "ckpt" / f"step-{stop_at:08d}.pt"

    resumed = TinyRegressor(**knobs)  # different initial weights: all must come from the file
    result = Trainer(TrainerConfig(checkpoint_dir=str(tmp_path / "b"), **config)).fit(
        resumed, make_loader(kind), resume=saved
    )
    assert result.step == 12
    assert_same_parameters(straight, resumed, exact=True)


def test_resume_accepts_a_loaded_dict_and_keeps_the_epoch(tmp_path: Path) -> None:
    straight = tiny()
    first = fit(
        straight,
        make_loader("list"),
        tmp_path,
        max_epochs=2,
        checkpoint_every=15,
        keep_checkpoints=2,
    )
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "step-00000015.pt")
    assert (checkpoint["step"], checkpoint["epoch"], checkpoint["batch_in_epoch"]) == (15, 1, 5)
    resumed = TinyRegressor()
    config = TrainerConfig(max_epochs=2, checkpoint_at_end=False)
    again = Trainer(config).fit(resumed, make_loader("list"), resume=checkpoint)
    assert (first.step, first.epoch) == (again.step, again.epoch) == (20, 2)
    assert_same_parameters(straight, resumed, exact=True)


@pytest.mark.parametrize(("log_every", "accumulate"), [(4, 2), (100, 1), (1, 3)])
def test_nan_loss_stops_naming_the_first_bad_step(
    tmp_path: Path, log_every: int, accumulate: int
) -> None:
    # Call 12 (0-based) belongs to optimizer step 12 // accumulate + 1.
    bad_step = 12 // accumulate + 1
    model = tiny(nan_at_call=12)
    with pytest.raises(LossNotFinite, match=f"loss is nan at step {bad_step};") as caught:
        fit(
            model,
            make_loader("list"),
            tmp_path,
            max_steps=20,
            log_every=log_every,
            accumulate=accumulate,
            checkpoint_every=bad_step - 1,
        )
    assert caught.value.step == bad_step and caught.value.code == "loss_not_finite"
    # The checkpoint before the bad step exists; none was written after it.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [f"step-{bad_step - 1:08d}.pt"]


class AutocastProbe(TinyRegressor):
    """Records the dtype its forward computed in, to prove autocast was on."""

    seen: torch.dtype | None = None

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        out = self(x)
        self.seen = out.dtype
        return torch.nn.functional.mse_loss(out.float(), y)


def test_bf16_mixed_runs_on_cpu(tmp_path: Path) -> None:
    torch.manual_seed(0)
    probe = AutocastProbe()
    result = fit(probe, make_loader("list"), tmp_path, max_steps=20, precision="bf16-mixed")
    assert probe.seen == torch.bfloat16
    assert probe.net[0].weight.dtype == torch.float32  # parameters stay fp32 (mixed precision)
    assert result.metrics["loss"] is not None and result.metrics["loss"] < 10


def test_fp16_on_cpu_is_refused_before_training(tmp_path: Path) -> None:
    model = tiny()
    before = model.net[0].weight.detach().clone()
    with pytest.raises(PrecisionUnsupported, match="'16-mixed' needs a CUDA device") as caught:
        fit(model, make_loader("list"), tmp_path, max_steps=2, precision="16-mixed")
    assert "bf16-mixed" in caught.value.hint
    assert torch.equal(model.net[0].weight, before)


def test_validation_metrics_do_not_change_training(tmp_path: Path) -> None:
    data = regression_data(40)
    val = DataLoader(regression_data(16, seed=1), batch_size=8)
    with_val, without = tiny(dropout=0.3), tiny(dropout=0.3)
    result = Trainer(TrainerConfig(max_steps=9, val_every=4, checkpoint_at_end=False)).fit(
        with_val, distributed_loader(data, 4), val
    )
    fit(without, distributed_loader(data, 4), tmp_path, max_steps=9, checkpoint_at_end=False)
    assert set(result.metrics) >= {"loss", "samples_per_s", "lr", "val_loss", "val_mae"}
    assert_same_parameters(with_val, without, exact=True)  # validation leaves the RNG alone
    assert with_val.training  # back in train mode afterwards
    with_val.eval()
    with torch.no_grad():
        expected = sum(with_val.validation_step(b)["loss"].item() for b in val) / 2
    assert result.metrics["val_loss"] == pytest.approx(expected, rel=1e-5)


def test_checkpoint_is_plain_data_that_loads_with_weights_only(tmp_path: Path) -> None:
    config = TrainerConfig(
        max_steps=6, checkpoint_every=2, keep_checkpoints=2, checkpoint_dir=str(tmp_path / "ckpt")
    )
    result = Trainer(config).fit(tiny(scheduler=True, optimizer="adamw"), make_loader("list"))
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["step-00000004.pt", "step-00000006.pt"]  # only the newest two are kept
    assert result.checkpoint == tmp_path / "ckpt" / "step-00000006.pt"
    checkpoint = torch.load(result.checkpoint, weights_only=True)
    assert checkpoint["format"] == "gpulayer.torch.checkpoint" and checkpoint["version"] == 1
    assert checkpoint["config"] == config.model_dump(mode="json")
    assert checkpoint["scheduler"]["last_epoch"] == 6 and checkpoint["scaler"] is None
    rng = checkpoint["rng"][0]
    assert set(rng) == {"torch", "cuda", "mps", "python", "numpy"}
    assert isinstance(rng["torch"], torch.Tensor)


def test_checkpoint_goes_to_the_job_output_dir_by_default(tmp_path: Path) -> None:
    result = Trainer(TrainerConfig(max_steps=2)).fit(tiny(), make_loader("list"))
    assert result.checkpoint == tmp_path / "output" / "step-00000002.pt"
    assert result.checkpoint.is_file()


def test_load_checkpoint_refuses_what_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(CheckpointInvalid, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"model": {}}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointInvalid, match="not a GPUlayer training checkpoint"):
        load_checkpoint(tmp_path / "plain.pt")
    torch.save({"format": "gpulayer.torch.checkpoint", "version": 99}, tmp_path / "new.pt")
    with pytest.raises(CheckpointInvalid, match="version 99"):
        load_checkpoint(tmp_path / "new.pt")
    torch.save({"format": "gpulayer.torch.checkpoint", "hook": Path("x")}, tmp_path / "obj.pt")
    with pytest.raises(CheckpointInvalid, match="weights_only"):
        load_checkpoint(tmp_path / "obj.pt")  # arbitrary objects never unpickle


def test_batches_of_dicts_are_moved_and_counted(tmp_path: Path) -> None:
    class DictModel(TinyRegressor):
        def training_step(self, batch: Any) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self(batch["x"]), batch["y"])

    data = regression_data(32)
    batches = [{"x": data[i : i + 8][0], "y": data[i : i + 8][1]} for i in range(0, 32, 8)]
    result = fit(DictModel(), batches, tmp_path, max_epochs=3, log_every=2)
    assert (result.step, result.epoch) == (12, 3)
    assert result.metrics["samples_per_s"] is not None and result.metrics["samples_per_s"] > 0


def test_inputs_are_checked(tmp_path: Path) -> None:
    class NoValidation(Module):
        def training_step(self, batch: Any) -> torch.Tensor:
            return torch.zeros(())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

    with pytest.raises(InvalidInput, match="does not define validation_step"):
        fit(NoValidation(), [1], tmp_path, max_steps=1, val_loader=[1])
    with pytest.raises(InvalidInput, match="needs a gpulayer_kernel.torch.Module"):
        Trainer(TrainerConfig(max_steps=1)).fit(torch.nn.Linear(1, 1), [1])  # type: ignore[arg-type]
    with pytest.raises(NoTrainingData, match="no batches in epoch 0"):
        fit(tiny(), [], tmp_path, max_epochs=1)
    with pytest.raises(TypeError, match="abstract"):
        Module()  # type: ignore[abstract]


class CountingSyncs:
    """Counts calls that copy a tensor's value to the host (each one a device sync on a GPU)."""

    names = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in self.names:
            original = getattr(torch.Tensor, name)

            def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.count += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def test_steps_never_sync_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [regression_data(8 * 30)[i : i + 8] for i in range(0, 240, 8)]
    counts = []
    for steps in (5, 25):
        counter = CountingSyncs(monkeypatch)
        fit(tiny(), batches, tmp_path, max_steps=steps, log_every=1000, checkpoint_at_end=False)
        counts.append(counter.count)
        monkeypatch.undo()
    assert counts[0] == counts[1]  # 20 more steps, not one more host sync
    assert counts[0] <= 3  # the one final reduction of the metrics


class EagerCompiled(TinyRegressor):
    """Compiles with dynamo's eager backend: the same graph capture, no C++ build (~50 s)."""

    def compile(self, *args: Any, **kwargs: Any) -> None:
        super().compile(backend="eager")


@pytest.mark.slow
def test_compile_flag_compiles_the_module_in_place(tmp_path: Path) -> None:
    torch.manual_seed(0)
    compiled = EagerCompiled()
    fit(compiled, make_loader("list"), tmp_path, max_steps=4, compile=True)
    assert compiled._compiled_call_impl is not None  # self(...) in the hooks is compiled
    plain = tiny()
    fit(plain, make_loader("list"), tmp_path, max_steps=4)
    assert_same_parameters(compiled, plain, exact=False)
    saved = torch.load(tmp_path / "ckpt" / "step-00000004.pt", weights_only=True)["model"]
    assert set(saved) == set(plain.state_dict())  # no "_orig_mod." prefixes in checkpoints


def test_history_is_the_loss_curve_one_entry_per_log_boundary(tmp_path: Path) -> None:
    result = fit(tiny(), make_loader("list"), tmp_path, max_steps=12, log_every=4)
    assert [h["step"] for h in result.history] == [4, 8, 12]
    losses = [h["loss"] for h in result.history]
    assert all(isinstance(v, float) for v in losses)
    assert result.history[-1]["loss"] == result.metrics["loss"]
