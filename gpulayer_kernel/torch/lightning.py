"""Checkpoint interchange with Lightning: its ``.ckpt`` weights in, a ``.ckpt`` it loads out.

Neither direction imports Lightning. A Lightning checkpoint is a ``torch.save`` dict whose
``state_dict`` holds the LightningModule's parameters under the same names a GPUlayer
``Module`` with the same attributes has (``self.net`` is ``net.*`` in both), so::

    model.load_state_dict(from_lightning("epoch=3-step=400.ckpt"))   # Lightning -> GPUlayer
    to_lightning(result.checkpoint, "model.ckpt", hyper_parameters={"hidden": 64})
    LitModel.load_from_checkpoint("model.ckpt")                         # GPUlayer -> Lightning

Only weights travel: the optimizer's state, the loops' position and the callbacks' state stay
with the trainer that wrote them (their layouts differ), so a run continues from the weights
with a fresh optimizer. Reading uses ``torch.load(weights_only=True)``, as GPUlayer's own
checkpoints do; a ``.ckpt`` holding Python objects (``save_hyperparameters`` of an object) is
refused unless ``weights_only=False`` says the file is trusted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_checkpoint, save_checkpoint
from .errors import CheckpointInvalid

#: the Lightning version whose checkpoint layout :func:`to_lightning` writes (tested against it;
#: later versions migrate older checkpoints when they load them)
LIGHTNING_VERSION = "2.6.6"


def from_lightning(
    source: str | os.PathLike[str] | Mapping[str, Any], *, weights_only: bool = True
) -> dict[str, torch.Tensor]:
    """The model ``state_dict`` inside a Lightning checkpoint (a path or the loaded dict)."""
    where = "the checkpoint dict"
    if isinstance(source, Mapping):
        checkpoint: Any = source
    else:
        where = os.fspath(source)
        try:
            checkpoint = torch.load(where, map_location="cpu", weights_only=weights_only)
        except FileNotFoundError:
            raise CheckpointInvalid(
                f"no checkpoint at {where}", hint="pass the .ckpt file Lightning wrote"
            ) from None
        except Exception as exc:  # unpickling errors have no common base class
            raise CheckpointInvalid(
                f"{where} does not load with weights_only=True: {exc}",
                hint="it holds Python objects (often save_hyperparameters() of an object); "
                "if you trust the file, pass weights_only=False",
                details={"file": where},
            ) from None
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint:
        raise CheckpointInvalid(
            f"{where} is not a Lightning checkpoint (no 'state_dict')",
            hint="GPUlayer's own checkpoints load with load_checkpoint(path)['model']",
            details={"file": where},
        )
    return dict(checkpoint["state_dict"])


def to_lightning(
    source: torch.nn.Module | str | os.PathLike[str] | Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    hyper_parameters: Mapping[str, Any] | None = None,
) -> Path:
    """Write a ``.ckpt`` that ``LightningModule.load_from_checkpoint(path)`` loads.

    ``source``: a module, or a GPUlayer checkpoint (path or dict) whose weights, step and epoch
    are taken. ``hyper_parameters`` are what Lightning passes to the module's ``__init__``
    (plain values). Saved atomically; loads with ``weights_only=True``.
    """
    step = epoch = 0
    if isinstance(source, torch.nn.Module):
        state = source.state_dict()
    else:
        checkpoint = load_checkpoint(source)
        if "model" not in checkpoint:
            raise CheckpointInvalid(
                f"{source} is a sharded checkpoint; Lightning reads one full state dict",
                hint="train with checkpoint_format='full', or pass the module itself",
            )
        state, step, epoch = checkpoint["model"], checkpoint["step"], checkpoint["epoch"]
    ckpt: dict[str, Any] = {
        "epoch": int(epoch),
        "global_step": int(step),
        "pytorch-lightning_version": LIGHTNING_VERSION,
        "state_dict": {k: v.detach().cpu() for k, v in state.items()},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
    }
    if hyper_parameters is not None:
        ckpt["hyper_parameters"] = dict(hyper_parameters)
    return save_checkpoint(ckpt, Path(path))
