"""The Trainer's one frozen configuration, saved as plain JSON inside every checkpoint."""

from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from ..contracts import Contract

Precision = Literal["32", "bf16-mixed", "16-mixed"]
Strategy = Literal["auto", "ddp", "fsdp"]
CheckpointFormat = Literal["full", "sharded"]

#: Fields that change what a step computes: resuming under different values is refused unless
#: the fit names them in ``override`` (the others, lengths and cadences, may change freely).
EXACT_FIELDS = (
    "precision",
    "accumulate",
    "grad_clip",
    "seed",
    "deterministic",
    "limit_train_batches",
)


class TrainerConfig(Contract):
    """How to train: length, precision, accumulation, clipping, logging and checkpoint cadence.

    Exactly one of ``max_steps`` and ``max_epochs`` is required (neither is needed with
    ``max_time`` or ``fast_dev_run``). Steps count optimizer steps (one per ``accumulate``
    micro-batches). Invalid values raise pydantic's ``ValidationError`` naming the field.
    """

    max_steps: int | None = Field(default=None, gt=0, description="optimizer steps to train")
    max_epochs: int | None = Field(default=None, gt=0, description="passes over train_loader")
    precision: Precision = Field(
        default="32",
        description="'32'; 'bf16-mixed' (autocast to bfloat16, CPU or GPU); '16-mixed' (autocast "
        "to float16 with a GradScaler, CUDA only: anywhere else fit() raises)",
    )
    accumulate: int = Field(default=1, gt=0, description="micro-batches per optimizer step")
    grad_clip: float | None = Field(default=None, gt=0, description="max global gradient norm")
    log_every: int = Field(
        default=50, gt=0, description="steps between reductions of the metrics (device syncs)"
    )
    val_every: int | None = Field(
        default=None, gt=0, description="steps between validations; None: only at the end"
    )
    checkpoint_every: int | None = Field(
        default=None, gt=0, description="steps between checkpoints; None: only at the end"
    )
    checkpoint_at_end: bool = Field(default=True, description="save a checkpoint when fit ends")
    checkpoint_dir: str | None = Field(
        default=None,
        description="where checkpoints go; None: gpulayer_kernel.job.output_dir() (in a job, "
        "$GPULAYER_OUTPUT, so checkpoints come back as artifacts)",
    )
    keep_checkpoints: int = Field(
        default=1, gt=0, description="how many of this run's newest checkpoint files to keep"
    )
    seed: int = Field(default=0, ge=0, description="seeds the training RNG (plus rank) and data")
    compile: bool = Field(default=False, description="torch.compile the module's forward")
    val_every_epochs: int | None = Field(
        default=None, gt=0, description="epochs between validations (at an epoch's end)"
    )
    max_time: float | None = Field(
        default=None,
        gt=0,
        description="stop after this many seconds of training (or 'DD:HH:MM:SS' / 'HH:MM:SS'); "
        "checked each step (at log boundaries with several ranks, so all stop together)",
    )
    fast_dev_run: int = Field(
        default=0,
        ge=0,
        description="True or n: run n (True: 1) training and validation batches, no loggers "
        "and no checkpoints, to check that the code runs",
    )
    limit_train_batches: int | float | None = Field(
        default=None, gt=0, description="batches per epoch: a count, or a fraction (0, 1]"
    )
    limit_val_batches: int | float | None = Field(
        default=None, gt=0, description="batches per validation: a count, or a fraction (0, 1]"
    )
    deterministic: bool = Field(
        default=False,
        description="torch.use_deterministic_algorithms(True) (and cuDNN deterministic) "
        "during the fit: reproducible GPU runs, at some speed",
    )

    strategy: Strategy = Field(
        default="auto",
        description="how several ranks share the model: 'auto' and 'ddp' replicate it "
        "(DistributedDataParallel); 'fsdp' shards parameters, gradients and optimizer state "
        "across ranks (torch's fully_shard, FSDP2). One process trains unwrapped either way",
    )
    find_unused_parameters: bool = Field(
        default=False,
        description="DDP: let parameters take no part in some steps' loss (costs a graph walk "
        "per step); the alternative is requires_grad_(False) on parameters never used",
    )
    static_graph: bool = Field(
        default=False,
        description="DDP: the set of used parameters never changes between steps (lets DDP "
        "skip work, and allows unused parameters at no per-step cost)",
    )
    checkpoint_format: CheckpointFormat = Field(
        default="full",
        description="'full': one .pt file written by rank zero; 'sharded' (strategy='fsdp'): a "
        "directory in which each rank writes its own shards (torch.distributed.checkpoint)",
    )

    @field_validator("max_time", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not re.fullmatch(r"\d+(:\d{1,2}){2,3}", value):
                raise ValueError(f"max_time {value!r} is not 'DD:HH:MM:SS' or 'HH:MM:SS'")
            parts = [int(p) for p in value.split(":")]
            seconds = 0
            for unit, part in zip((86400, 3600, 60, 1)[-len(parts) :], parts, strict=True):
                seconds += unit * part
            return float(seconds)
        return value

    @field_validator("fast_dev_run", mode="before")
    @classmethod
    def _dev_run(cls, value: Any) -> Any:
        return int(value) if isinstance(value, bool) else value

    @field_validator("limit_train_batches", "limit_val_batches")
    @classmethod
    def _fraction(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, float) and value > 1:
            raise ValueError(f"a fraction must be in (0, 1], not {value}; pass an int for a count")
        return value

    @model_validator(mode="after")
    def _one_length(self) -> Self:
        if self.max_steps is not None and self.max_epochs is not None:
            raise ValueError("set exactly one of max_steps or max_epochs (both given)")
        if self.strategy == "fsdp" and (self.find_unused_parameters or self.static_graph):
            raise ValueError(
                "find_unused_parameters and static_graph are DDP options; strategy='fsdp' "
                "needs neither (unused parameters simply get no gradient)"
            )
        if self.strategy == "fsdp" and self.precision == "16-mixed":
            raise ValueError(
                "precision '16-mixed' with strategy='fsdp': its GradScaler is not wired to "
                "sharded gradients; use 'bf16-mixed' (no scaler needed)"
            )
        if self.checkpoint_format == "sharded" and self.strategy != "fsdp":
            raise ValueError(
                "checkpoint_format='sharded' saves FSDP shards; set strategy='fsdp' (a DDP "
                "model is whole on every rank: 'full' is all there is to save)"
            )
        if self.max_steps is None and self.max_epochs is None:
            if not (self.fast_dev_run or self.max_time):
                raise ValueError("set exactly one of max_steps or max_epochs (neither given)")
        return self
