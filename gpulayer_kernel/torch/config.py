"""The Trainer's one frozen configuration, saved as plain JSON inside every checkpoint."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from ..contracts import Contract

Precision = Literal["32", "bf16-mixed", "16-mixed"]


class TrainerConfig(Contract):
    """How to train: length, precision, accumulation, clipping, logging and checkpoint cadence.

    Exactly one of ``max_steps`` and ``max_epochs`` is required. Steps count optimizer steps
    (one per ``accumulate`` micro-batches). Invalid values raise pydantic's ``ValidationError``
    naming the field.
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

    @model_validator(mode="after")
    def _one_length(self) -> Self:
        if (self.max_steps is None) == (self.max_epochs is None):
            given = "both" if self.max_steps is not None else "neither"
            raise ValueError(f"set exactly one of max_steps or max_epochs ({given} given)")
        return self
