"""Checkpoints as plain dicts that carry their config, saved atomically and loaded safely.

A checkpoint is what ``torch.save`` writes of::

    {"format": "gpulayer.torch.checkpoint", "version": 1,
     "model": state_dict, "optimizer": ..., "scheduler": ... | None, "scaler": ... | None,
     "step": int, "epoch": int, "batch_in_epoch": int,
     "config": TrainerConfig as a JSON dict,
     "rng": [per-rank {"torch", "cuda", "mps", "python", "numpy"}]}

Everything in it is a tensor or a plain Python value, so it loads with
``torch.load(..., weights_only=True)``: opening a checkpoint someone sent you never runs
their code. NumPy's generator state is stored as a list of ints for the same reason.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..job import JOB_ID_ENV, OUTPUT_ENV
from .errors import CheckpointInvalid

FORMAT = "gpulayer.torch.checkpoint"
VERSION = 1
#: in a sharded checkpoint's directory: everything but the model and optimizer shards, written
#: by rank zero after the shards (``torch.distributed.checkpoint`` files beside it)
SHARDED_REST = "trainer.pt"
SHARDED_SUFFIX = ".dcp"


def artifact_name(path: Path) -> str | None:
    """The name ``path`` comes back under as an artifact of this job; None when it won't.

    Files under ``$GPULAYER_OUTPUT`` become artifacts named by their path below it; a gang's
    ranks each write under ``rank<R>/`` (their ``$GPULAYER_OUTPUT`` ends in it), and that part
    is in the name. The scratch path itself is gone once the job ends: the name is what
    ``gpulayer artifacts JOB --get NAME`` and ``handle.download(NAME)`` take.
    """
    out = os.environ.get(OUTPUT_ENV)
    if not out or JOB_ID_ENV not in os.environ:
        return None
    try:
        relative = path.resolve().relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        return None  # saved elsewhere (checkpoint_dir): not an artifact
    rank = os.environ.get("RANK")
    if rank is not None and Path(out).name == f"rank{rank}":
        return f"rank{rank}/{relative}"
    return relative


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's RNG states (torch CPU, the training accelerator's, Python, NumPy)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    state["cuda"] = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    state["mps"] = torch.mps.get_rng_state() if device.type == "mps" else None
    state["numpy"] = None
    try:
        import numpy
    except ImportError:
        return state
    kind, key, pos, has_gauss, gauss = numpy.random.get_state(legacy=True)
    state["numpy"] = {
        "kind": kind,
        "key": [int(k) for k in key],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }
    return state


def restore_rng(state: Mapping[str, Any], device: torch.device) -> None:
    """Put back RNG states taken by :func:`capture_rng` (parts for absent devices are skipped)."""
    torch.set_rng_state(state["torch"])
    python = state["python"]
    # After a round trip through the unpickler the inner state may be a list; setstate wants tuples.
    random.setstate((python[0], tuple(python[1]), python[2]))
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if state.get("mps") is not None and device.type == "mps":
        torch.mps.set_rng_state(state["mps"])
    saved = state.get("numpy")
    if saved is None:
        return
    try:
        import numpy
    except ImportError:
        return
    key = numpy.asarray(saved["key"], dtype=numpy.uint32)
    numpy.random.set_state((saved["kind"], key, saved["pos"], saved["has_gauss"], saved["gauss"]))


def save_checkpoint(checkpoint: Mapping[str, Any], path: Path) -> Path:
    """Write ``checkpoint`` to ``path`` atomically: a crash mid-write leaves the old file intact.

    Costs one full write of the state (seconds for a large model); call it on rank zero only.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(dict(checkpoint), partial)
    os.replace(partial, path)
    return path


def load_checkpoint(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Load and check a checkpoint from a path (safely: ``weights_only=True``) or take a dict.

    Tensors load onto the CPU; the Trainer moves them to its device.
    """
    sharded: str | None = None
    if isinstance(source, Mapping):
        checkpoint = dict(source)
        where = "the checkpoint dict"
    else:
        where = os.fspath(source)
        if os.path.isdir(where):  # a sharded checkpoint: its shards are read by the strategy
            sharded = where
            if not os.path.isfile(os.path.join(where, SHARDED_REST)):
                raise CheckpointInvalid(
                    f"{where} is a directory without {SHARDED_REST}: not a finished sharded "
                    "checkpoint",
                    hint="pass a directory that Trainer.fit wrote with checkpoint_format="
                    "'sharded' (an unfinished save lacks the file)",
                )
            where = os.path.join(where, SHARDED_REST)
        try:
            checkpoint = torch.load(where, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise CheckpointInvalid(
                f"no checkpoint at {where}",
                hint="pass a .pt file that Trainer.fit wrote (FitResult.checkpoint)",
            ) from None
        except Exception as exc:  # unpickling errors have no common base class
            raise CheckpointInvalid(
                f"{where} is not a loadable checkpoint: {exc}",
                hint="it must be written by Trainer.fit; files holding arbitrary Python "
                "objects are refused on purpose (weights_only loading)",
            ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise CheckpointInvalid(
            f"{where} is not a GPUlayer training checkpoint (no format={FORMAT!r})",
            hint="resume only from checkpoints written by gpulayer_kernel.torch.Trainer",
        )
    version = checkpoint.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointInvalid(
            f"{where} has checkpoint version {version!r}; this GPUlayer reads up to {VERSION}",
            hint="upgrade gpulayer to resume from it",
        )
    if sharded is not None:
        checkpoint["sharded"] = sharded
    return checkpoint
