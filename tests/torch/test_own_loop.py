"""The own-loop helpers in one process: prepare, accumulate, backward, gather, save/load_state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from gpulayer_kernel.torch import (  # noqa: E402
    CheckpointInvalid,
    PrecisionUnsupported,
    accumulate,
    backward,
    gather,
    load_state,
    prepare,
    save_state,
    unwrap,
)
from gpulayer_kernel.torch.testing import regression_data  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_process")]


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def own_loop(batch_size: int, micro: int, steps: int, precision: Any = "32") -> Any:
    """The loop a user writes with the helpers; returns the model and its optimizer."""
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(regression_data(64), batch_size=batch_size)
    model, optimizer, loader = prepare(
        model, optimizer, loader, precision=precision, accumulate=micro
    )
    done = 0
    while done < steps * micro:
        for x, y in loader:
            with accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
                backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            done += 1
            if done == steps * micro:
                break
    return model, optimizer


def test_accumulating_micro_batches_equals_the_whole_batch() -> None:
    accumulated, _ = own_loop(batch_size=4, micro=4, steps=3)
    whole, _ = own_loop(batch_size=16, micro=1, steps=3)
    for a, b in zip(accumulated.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(next(iter(accumulated.parameters())), next(iter(net().parameters())))


def test_bf16_prepared_models_run_their_forward_under_autocast() -> None:
    model = prepare(net(), precision="bf16-mixed")
    assert model(torch.randn(2, 8)).dtype == torch.bfloat16
    with pytest.raises(PrecisionUnsupported, match="needs a CUDA device"):
        prepare(net(), precision="16-mixed")


def test_gather_in_one_process_is_the_tensor() -> None:
    assert torch.equal(gather(torch.tensor([1.0, 2.0])), torch.tensor([1.0, 2.0]))
    assert torch.equal(gather(torch.tensor(3.0)), torch.tensor([3.0]))


def test_save_and_load_state_continue_exactly(tmp_path: Path) -> None:
    def steps(model: Any, optimizer: Any, loader: Any, n: int) -> None:
        for _, (x, y) in zip(range(n), loader, strict=False):
            with accumulate(model):
                backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()

    def fresh() -> Any:
        model = net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
        loader = DataLoader(regression_data(64), batch_size=8, shuffle=True)
        return prepare(model, opt, sched, loader)

    torch.manual_seed(1)
    model, opt, sched, loader = fresh()
    steps(model, opt, loader, 3)
    save_state(tmp_path)
    steps(model, opt, loader, 4)
    straight = [p.detach().clone() for p in model.parameters()]

    other, opt2, sched2, loader2 = fresh()
    load_state(tmp_path)
    steps(other, opt2, loader2, 4)
    for a, b in zip(straight, unwrap(other).parameters(), strict=True):
        assert torch.equal(a, b)


def test_load_state_refuses_what_save_state_did_not_write(tmp_path: Path) -> None:
    prepare(net())
    with pytest.raises(CheckpointInvalid, match="no saved state at"):
        load_state(tmp_path)
    torch.save({"format": "other"}, tmp_path / "state.pt")
    with pytest.raises(CheckpointInvalid, match="was not written by save_state"):
        load_state(tmp_path)
