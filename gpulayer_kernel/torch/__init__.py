"""PyTorch integration (ADR 0014): runtime helpers for code in a job, and a small Trainer.

Importing this package imports torch but never initialises CUDA, so a kernel can import it
and still fork workers. Start with :class:`Module`, :class:`TrainerConfig` and :class:`Trainer`;
docs/trainer.md has a complete example.
"""

from __future__ import annotations

from .checkpoint import load_checkpoint
from .config import TrainerConfig
from .data import distributed_loader, to_device
from .errors import (
    CheckpointInvalid,
    LossNotFinite,
    NoTrainingData,
    OptimizersInvalid,
    PrecisionUnsupported,
    SchedulerUnsupported,
    TrainingStepInvalid,
    ValidationStepInvalid,
)
from .module import Module
from .progress import PEAK_FLOPS, peak_flops
from .runtime import (
    all_reduce_mean,
    barrier,
    destroy_distributed,
    device,
    init_distributed,
    is_rank_zero,
    local_rank,
    print0,
    rank,
    seed_everything,
    world_size,
)
from .trainer import FitResult, Trainer

__all__ = [
    "PEAK_FLOPS",
    "CheckpointInvalid",
    "FitResult",
    "LossNotFinite",
    "Module",
    "NoTrainingData",
    "OptimizersInvalid",
    "PrecisionUnsupported",
    "SchedulerUnsupported",
    "Trainer",
    "TrainerConfig",
    "TrainingStepInvalid",
    "ValidationStepInvalid",
    "all_reduce_mean",
    "barrier",
    "destroy_distributed",
    "device",
    "distributed_loader",
    "init_distributed",
    "is_rank_zero",
    "load_checkpoint",
    "local_rank",
    "peak_flops",
    "print0",
    "rank",
    "seed_everything",
    "to_device",
    "world_size",
]
