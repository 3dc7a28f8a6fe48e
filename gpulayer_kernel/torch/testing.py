"""Tiny models, data and a multi-rank harness for testing code built on the training API.

Shipped in the package (like httpx's ``MockTransport``) so other parts of GPUlayer can test
against a real training loop and a real process group without a GPU:

* :class:`TinyRegressor`: a two-layer MLP Module with optional dropout, scheduler and a NaN
  loss at a chosen call, for checking the Trainer's behaviour;
* :class:`LoggingRegressor`: the same model reporting through ``self.log`` (train, validation),
  with ``test_step`` and ``predict_step``;
* :class:`RecordingCallback`: a callback that records every hook it hears, with state;
* :func:`regression_data`: a seeded in-memory dataset;
* :func:`spawn_ranks`: runs ``fn`` in ``world_size`` fresh processes that see torchrun's
  environment (gloo on CPU); about 2 s per start on a small machine, mostly ``import torch``.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.spawn import start_processes
from torch.utils.data import TensorDataset

from ..job.ranks import rank
from .callbacks import Callback
from .module import Module, OptimizerSetup


class TinyRegressor(Module):
    """A small MLP regressor whose knobs exercise the Trainer's paths."""

    def __init__(
        self,
        in_features: int = 8,
        hidden: int = 16,
        *,
        dropout: float = 0.0,
        optimizer: str = "sgd",
        lr: float = 0.05,
        scheduler: bool = False,
        nan_at_call: int | None = None,
    ) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(in_features, hidden),
            torch.nn.Dropout(dropout),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1),
        )
        self.optimizer_name, self.lr, self.scheduler = optimizer, lr, scheduler
        self.nan_at_call = nan_at_call  # 0-based training_step call that returns a NaN loss
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        if self.calls == self.nan_at_call:
            loss = loss * float("nan")
        self.calls += 1
        return loss

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        prediction = self(x)
        return {
            "loss": torch.nn.functional.mse_loss(prediction, y),
            "mae": (prediction - y).abs().mean(),
        }

    def configure_optimizers(self) -> OptimizerSetup:
        optimizer: torch.optim.Optimizer
        if self.optimizer_name == "adamw":
            optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        if not self.scheduler:
            return optimizer
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


class LoggingRegressor(TinyRegressor):
    """:class:`TinyRegressor` logging as a LightningModule does: ``self.log`` in every step."""

    def __init__(self, *args: Any, sync_dist: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sync_dist = sync_dist

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        prediction = self(x)
        loss = torch.nn.functional.mse_loss(prediction, y)
        mae = (prediction - y).abs().mean()
        self.log("train_mae", mae, prog_bar=True, on_epoch=True, sync_dist=self.sync_dist)
        self.log("rank", float(rank()))  # differs per rank: shows what sync_dist=False keeps
        return loss

    def validation_step(self, batch: Any) -> None:  # type: ignore[override]
        x, y = batch
        prediction = self(x)
        self.log("val_loss", torch.nn.functional.mse_loss(prediction, y), prog_bar=True)
        self.log("val_mae", (prediction - y).abs().mean(), sync_dist=True)

    def test_step(self, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(self(x), y)}

    def predict_step(self, batch: Any) -> torch.Tensor:
        out: torch.Tensor = self(batch[0])
        return out


class RecordingCallback(Callback):
    """Records ``(hook, step)`` for every hook; its state counts the calls (for resume tests)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.restored: dict[str, Any] | None = None

    def _note(self, hook: str, trainer: Any) -> None:
        self.calls.append((hook, trainer.step))

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        self._note("on_fit_start", trainer)

    def on_train_batch_end(self, trainer: Any, module: Any, loss: Any, batch: Any) -> None:
        self._note("on_train_batch_end", trainer)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self._note("on_train_epoch_end", trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        self._note("on_validation_end", trainer)

    def on_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        self._note("on_checkpoint", trainer)

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self._note("on_fit_end", trainer)

    def on_exception(self, trainer: Any, module: Any, error: BaseException) -> None:
        self._note("on_exception", trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"calls": len(self.calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = dict(state)


def regression_data(n: int = 64, in_features: int = 8, seed: int = 0) -> TensorDataset:
    """``n`` samples of a noisy linear target, the same for the same ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=generator)
    w = torch.randn(in_features, 1, generator=generator)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def free_port() -> int:
    """A TCP port that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(*args)`` as ranks 0..world_size-1 of a fresh process group; raise if one fails.

    ``fn`` must be importable by name (a module-level function) because the children are
    spawned, not forked: forking a process that already ran torch ops can deadlock in OpenMP.
    Each child sees ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
    as under torchrun, and should call ``init_distributed()``.
    """
    port = free_port()
    start_processes(  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        _rank_entry,
        args=(fn, world_size, port, args),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )


def _rank_entry(
    index: int, fn: Callable[..., None], world_size: int, port: int, args: tuple[Any, ...]
) -> None:
    os.environ.update(
        RANK=str(index),
        LOCAL_RANK=str(index),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)  # ranks share the machine's cores
    fn(*args)
    # fn has written what the test reads. Skip the interpreter's teardown: after a rank ends a
    # fit with an exception (LossNotFinite), gloo's C++ destructors can call std::terminate
    # at exit (seen once in a few runs: SIGABRT), which would fail a rank that did its work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
