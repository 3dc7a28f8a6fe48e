"""PyTorch integration (ADR 0014): runtime helpers for code in a job, and a small Trainer.

Importing this package imports torch but never initialises CUDA, so a kernel can import it
and still fork workers. Start with :class:`Module`, :class:`TrainerConfig` and :class:`Trainer`
(with :class:`Callback`, :class:`EarlyStopping`, :class:`ModelCheckpoint` and the loggers:
CSV, TensorBoard, W&B, MLflow);
for a loop of your own, :func:`prepare`, :func:`backward`, :func:`accumulate`, :func:`gather`,
:func:`save_state`. docs/trainer.md has a complete example, docs/migrating.md the way over from
Lightning and accelerate.
"""

from __future__ import annotations

from ..job.ranks import (
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
from .callbacks import Callback
from .checkpoint import load_checkpoint
from .config import TrainerConfig
from .data import distributed_loader, to_device
from .early_stopping import EarlyStopping
from .errors import (
    CallbackFailed,
    CallbackInvalid,
    CheckpointInvalid,
    ConfigChanged,
    DependencyMissing,
    HookMissing,
    LossNotFinite,
    ManualOptimizationInvalid,
    MetricInvalid,
    MetricNotFound,
    NoTrainingData,
    OptimizersInvalid,
    PrecisionUnsupported,
    SchedulerUnsupported,
    TrainingStepInvalid,
    UnusedParameters,
    ValidationStepInvalid,
)
from .lightning import from_lightning, to_lightning
from .loggers import CSVLogger, Logger, TensorBoardLogger
from .model_checkpoint import ModelCheckpoint
from .module import Module
from .own_loop import accumulate, backward, gather, load_state, prepare, save_state, unwrap
from .progress import PEAK_FLOPS, peak_flops
from .trackers import MLflowLogger, WandbLogger
from .trainer import FitResult, Trainer

__all__ = [
    "PEAK_FLOPS",
    "CSVLogger",
    "Callback",
    "CallbackFailed",
    "CallbackInvalid",
    "CheckpointInvalid",
    "ConfigChanged",
    "DependencyMissing",
    "EarlyStopping",
    "FitResult",
    "HookMissing",
    "Logger",
    "LossNotFinite",
    "MLflowLogger",
    "ManualOptimizationInvalid",
    "MetricInvalid",
    "MetricNotFound",
    "ModelCheckpoint",
    "Module",
    "NoTrainingData",
    "OptimizersInvalid",
    "PrecisionUnsupported",
    "SchedulerUnsupported",
    "TensorBoardLogger",
    "Trainer",
    "TrainerConfig",
    "TrainingStepInvalid",
    "UnusedParameters",
    "ValidationStepInvalid",
    "WandbLogger",
    "accumulate",
    "all_reduce_mean",
    "backward",
    "barrier",
    "destroy_distributed",
    "device",
    "distributed_loader",
    "from_lightning",
    "gather",
    "init_distributed",
    "is_rank_zero",
    "load_checkpoint",
    "load_state",
    "local_rank",
    "peak_flops",
    "prepare",
    "print0",
    "rank",
    "save_state",
    "seed_everything",
    "to_device",
    "to_lightning",
    "unwrap",
    "world_size",
]
