"""Checkpoint interchange with the real Lightning 2.6: its .ckpt weights into a GPUlayer Module,
and a .ckpt from a GPUlayer fit that ``LightningModule.load_from_checkpoint`` and
``L.Trainer.validate(ckpt_path=...)`` load. Lightning is in the dev extra: this runs in CI."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if find_spec("lightning") is None:
    # Found, not imported: Lightning takes ~2 s to import, in every xdist worker that collects
    # this file; only the worker that runs these tests imports it (``lit``).
    pytest.skip("needs lightning (the dev extra)", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from gpulayer_kernel.torch import (  # noqa: E402
    CheckpointInvalid,
    Module,
    Trainer,
    from_lightning,
    to_lightning,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def net(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(20, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3)
    )


@cache
def lit_class() -> Any:
    """The LightningModule twin of ``Ours`` (Lightning imported here, on first use)."""
    import lightning as L

    class Lit(L.LightningModule):
        def __init__(self, hidden: int = 32) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = net(hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Lit


@pytest.fixture
def lit() -> Any:
    return lit_class()


class Ours(Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = net(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture
def loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 20, generator=g), torch.randint(0, 3, (64,), generator=g))
    return DataLoader(data, batch_size=16)


@pytest.fixture(autouse=True)
def _lightning_quiet() -> Iterator[None]:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():  # Lightning's advice (workers, log intervals) is noise here
        warnings.simplefilter("ignore")
        yield


def lightning_trainer(root: Path, **options: Any) -> Any:
    import lightning as L

    return L.Trainer(
        default_root_dir=str(root),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


def test_a_lightning_checkpoint_loads_into_the_same_gpulayer_module(
    single_process: Path, loader: DataLoader[Any], lit: Any
) -> None:
    torch.manual_seed(0)
    model = lit(hidden=32)
    trainer = lightning_trainer(single_process, max_steps=3, enable_checkpointing=False)
    trainer.fit(model, loader)
    trainer.save_checkpoint(single_process / "lit.ckpt")

    ours = Ours(hidden=32)
    ours.load_state_dict(from_lightning(single_process / "lit.ckpt"))  # weights_only=True
    for key, value in model.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    # and training goes on from those weights with the Trainer
    result = Trainer(max_steps=2, log_every=1, loggers=[]).fit(ours, loader)
    assert result.step == 2


def test_a_gpulayer_checkpoint_saved_for_lightning_loads_there(
    single_process: Path, loader: DataLoader[Any], lit: Any
) -> None:
    torch.manual_seed(0)
    ours = Ours(hidden=16)
    result = Trainer(max_steps=4, log_every=2, loggers=[]).fit(ours, loader)
    path = to_lightning(
        result.checkpoint, single_process / "ours.ckpt", hyper_parameters={"hidden": 16}
    )
    assert torch.load(path, weights_only=True)["global_step"] == 4

    loaded = lit.load_from_checkpoint(path)
    assert loaded.hparams.hidden == 16
    for key, value in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    [metrics] = lightning_trainer(single_process).validate(lit(hidden=16), loader, ckpt_path=path)
    x, y = next(iter(DataLoader(loader.dataset, batch_size=64)))
    expected = F.cross_entropy(ours(x), y).item()
    assert metrics["val_loss"] == pytest.approx(expected, rel=1e-5)


def test_a_module_saves_directly_and_bad_files_are_named(single_process: Path, lit: Any) -> None:
    torch.manual_seed(0)
    ours = Ours()
    lit.load_from_checkpoint(to_lightning(ours, single_process / "direct.ckpt"))
    with pytest.raises(CheckpointInvalid, match="no checkpoint at"):
        from_lightning(single_process / "missing.ckpt")
    torch.save({"model": ours.state_dict()}, single_process / "not-lightning.pt")
    with pytest.raises(CheckpointInvalid, match="no 'state_dict'") as caught:
        from_lightning(single_process / "not-lightning.pt")
    assert "load_checkpoint" in caught.value.hint
    torch.save({"state_dict": {}, "hyper_parameters": {"fn": print}}, single_process / "obj.ckpt")
    with pytest.raises(CheckpointInvalid, match="weights_only=True") as pickled:
        from_lightning(single_process / "obj.ckpt")
    assert "weights_only=False" in pickled.value.hint
    assert from_lightning(single_process / "obj.ckpt", weights_only=False) == {}
