"""The training loop: ``Trainer(config).fit(module, train_loader)`` on any device, any world size.

:meth:`Trainer.fit` is meant to be read top to bottom; everything that is not the step itself
(setup, metrics, validation, checkpoints) lives in :class:`_Run` below it. What a step costs
beyond a hand-written loop: one list append for the loss and a few Python branches. It never
waits for the device: metrics are reduced every ``log_every`` steps (see ``progress.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

from .. import job
from ..errors import InvalidInput
from .checkpoint import (
    FORMAT,
    VERSION,
    artifact_name,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from .config import TrainerConfig
from .contract import (
    check_optimizers,
    check_train_loader,
    check_training_step,
    check_validation_step,
)
from .data import batch_size_of, epoch_iterator, loader_length, to_device
from .errors import NoTrainingData, PrecisionUnsupported
from .module import Module, has_validation_step
from .progress import MetricWindow, ProgressDisplay, peak_flops
from .runtime import barrier, device, init_distributed, is_rank_zero, rank, seed_everything
from .runtime import world_size as get_world_size

Metrics = dict[str, float | None]


@dataclass(frozen=True)
class FitResult:
    """What :meth:`Trainer.fit` did: where it stopped, its last metrics, its last checkpoint.

    ``step`` counts optimizer steps done; ``epoch`` is the 0-based epoch counter, which
    advances when an epoch's data runs out; ``metrics`` are the last reduced values (``loss``,
    ``samples_per_s``, ``mfu``, ``lr``, ``val_*``); ``checkpoint`` is None when none was saved.
    Inside a GPUlayer job ``checkpoint`` is a scratch path, gone when the job ends; ``artifact``
    is the name it comes back under (``gpulayer artifacts JOB --get NAME``).
    """

    step: int
    epoch: int
    metrics: Metrics
    checkpoint: Path | None
    #: one entry per log boundary: ``{"step": …, "loss": …, …}`` (the loss curve); the values
    #: were reduced at that boundary anyway, so keeping them costs no extra device sync.
    history: list[dict[str, float | int | None]] = field(default_factory=list)
    #: the last checkpoint's artifact name inside a GPUlayer job (None outside one)
    artifact: str | None = None


class Trainer:
    """Trains a :class:`Module` as its :class:`TrainerConfig` says; reusable across fits."""

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config

    def fit(
        self,
        module: Module,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None = None,
        resume: str | Path | Mapping[str, Any] | None = None,
    ) -> FitResult:
        """Train ``module`` on ``train_loader`` (re-iterable: a DataLoader, a list of batches).

        ``resume`` (a checkpoint path or dict) continues exactly where that checkpoint left
        off, data order included. Raises :class:`LossNotFinite` naming the first bad step.
        """
        cfg = self.config
        init_distributed()
        run = _Run.start(cfg, module, device(), train_loader, val_loader, resume)
        try:
            while not run.finished():
                batches = epoch_iterator(train_loader, run.epoch, cfg.seed, run.batch_in_epoch)
                run.restore_rng_once()  # on resume: only now that the data is positioned
                for batch in batches:
                    batch = to_device(batch, run.device)
                    run.pending = (run.pending + 1) % cfg.accumulate  # 0: step after this one
                    run.batch_in_epoch += 1
                    # Accumulation micro-batches skip DDP's gradient all-reduce (no_sync).
                    with run.no_sync() if run.pending else nullcontext():
                        with run.autocast():
                            loss = run.train_step(batch)
                        run.window.add(loss, batch_size_of(batch))  # no .item(): no sync
                        scaled = loss / cfg.accumulate if cfg.accumulate > 1 else loss
                        run.scaler.scale(scaled).backward()  # type: ignore[no-untyped-call]
                    if run.pending:
                        continue
                    if cfg.grad_clip is not None:
                        run.scaler.unscale_(run.optimizer)
                        torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
                    run.scaler.step(run.optimizer)
                    run.scaler.update()
                    run.optimizer.zero_grad(set_to_none=True)
                    if run.scheduler is not None:
                        run.scheduler.step()
                    run.step += 1
                    run.at_step_end()  # log, validate, checkpoint when due
                    if run.finished():
                        break
                else:  # the epoch ran out
                    if run.batch_in_epoch == 0:
                        raise NoTrainingData(
                            f"train_loader yielded no batches in epoch {run.epoch}",
                            hint="check the dataset's length, batch_size and drop_last",
                        )
                    run.epoch, run.batch_in_epoch = run.epoch + 1, 0
            run.at_end()
        finally:
            run.display.close()
        saved = run.last_checkpoint
        return FitResult(
            run.step,
            run.epoch,
            dict(run.metrics),
            saved,
            list(run.history),
            artifact=artifact_name(saved) if saved is not None else None,
        )


class _TrainingStep(torch.nn.Module):
    """Routes DDP's forward to ``training_step``, so DDP's gradient hooks see every step."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any) -> torch.Tensor:
        return self.module.training_step(batch)


def _autocast(precision: str, dev: torch.device) -> Callable[[], AbstractContextManager[Any]]:
    if precision == "32":
        return nullcontext  # entering a disabled autocast still costs a few microseconds
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    return functools.partial(torch.autocast, device_type=dev.type, dtype=dtype)


@dataclass(eq=False)
class _Run:
    """The state of one fit: what to train, with what, where it has got to, what it reported."""

    config: TrainerConfig
    module: Module
    device: torch.device
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler | None
    scaler: torch.amp.GradScaler
    train_step: Callable[[Any], torch.Tensor]
    no_sync: Callable[[], AbstractContextManager[Any]]
    autocast: Callable[[], AbstractContextManager[Any]]
    val_loader: Iterable[Any] | None
    params: list[torch.nn.Parameter]
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    pending: int = 0  # micro-batches whose gradients wait for the next optimizer step
    rng: dict[str, Any] | None = None  # RNG to restore once the resumed epoch is positioned
    metrics: Metrics = field(default_factory=dict)
    history: list[dict[str, float | int | None]] = field(default_factory=list)
    window: MetricWindow = field(default_factory=MetricWindow)
    display: ProgressDisplay = field(default_factory=ProgressDisplay)
    last_checkpoint: Path | None = None
    written: list[Path] = field(default_factory=list)
    logged_step: int = 0  # the step of the last reduction: the window starts after it
    validated_step: int = -1
    checkpointed_step: int = -1
    total: int | None = None  # steps in the whole fit, when the loader has a length
    flops: float | None = None  # training FLOPs per sample, for MFU
    peak: float | None = None  # the device's peak FLOP/s, for MFU

    @classmethod
    def start(
        cls,
        cfg: TrainerConfig,
        module: Module,
        dev: torch.device,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None,
        resume: str | Path | Mapping[str, Any] | None,
    ) -> _Run:
        """Check the inputs, move the module, build optimizers, then seed or restore state."""
        if not isinstance(module, Module):
            raise InvalidInput(
                f"fit() needs a gpulayer_kernel.torch.Module, got {type(module).__name__}",
                hint="subclass gpulayer_kernel.torch.Module and define training_step and "
                "configure_optimizers",
            )
        if val_loader is not None and not has_validation_step(module):
            raise InvalidInput(
                f"val_loader given but {type(module).__name__} does not define validation_step",
                hint="define validation_step(batch) -> dict[str, Tensor], or drop val_loader",
            )
        if cfg.precision == "16-mixed" and dev.type != "cuda":
            raise PrecisionUnsupported(
                f"precision '16-mixed' needs a CUDA device; this rank trains on {dev.type}",
                hint="use precision='bf16-mixed' (runs on CPUs and recent GPUs) or '32'",
            )
        check_train_loader(train_loader, cfg)
        checkpoint = load_checkpoint(resume) if resume is not None else None
        if checkpoint is None:
            seed_everything(cfg.seed + rank())  # distinct dropout masks per rank
        module.to(dev)
        module.train()
        if checkpoint is not None:
            module.load_state_dict(checkpoint["model"])
        optimizer, scheduler = check_optimizers(module.configure_optimizers(), module)
        scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "16-mixed")
        if cfg.compile:
            module.compile()  # compiles __call__ in place: self(...) in the hooks is compiled
        train_step: Callable[[Any], torch.Tensor] = module.training_step
        no_sync: Callable[[], AbstractContextManager[Any]] = nullcontext
        if get_world_size() > 1:
            ddp = DistributedDataParallel(
                _TrainingStep(module), device_ids=[dev.index] if dev.type == "cuda" else None
            )
            train_step, no_sync = ddp, ddp.no_sync
        run = cls(
            config=cfg,
            module=module,
            device=dev,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            train_step=train_step,  # replaced just below, by a check of the first call
            no_sync=no_sync,
            autocast=_autocast(cfg.precision, dev),
            val_loader=val_loader,
            params=[p for p in module.parameters() if p.requires_grad],
        )
        run.train_step = functools.partial(run._first_train_step, train_step)
        if checkpoint is not None:
            run._load(checkpoint)
        run.flops = module.flops_per_sample()
        run.peak = peak_flops(dev) if run.flops else None
        run.total = cfg.max_steps
        batches = loader_length(train_loader)
        if cfg.max_epochs is not None and batches is not None:
            run.total = batches * cfg.max_epochs // cfg.accumulate
        return run

    def _first_train_step(self, step: Callable[[Any], Any], batch: Any) -> torch.Tensor:
        """Run and check the first call of ``training_step``; later calls skip the check."""
        loss = check_training_step(step(batch), self.module)
        self.train_step = step  # from now on the bare call: the check costs nothing per step
        return loss

    def _load(self, checkpoint: dict[str, Any]) -> None:
        """Take optimizer, scheduler, scaler state and position from a resumed checkpoint."""
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.scheduler is not None and checkpoint.get("scheduler") is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler"])
        if checkpoint.get("scaler") is not None:
            self.scaler.load_state_dict(checkpoint["scaler"])
        self.step = self.logged_step = self.validated_step = self.checkpointed_step = int(
            checkpoint["step"]
        )
        self.epoch, self.batch_in_epoch = (
            int(checkpoint["epoch"]),
            int(checkpoint["batch_in_epoch"]),
        )
        states = checkpoint["rng"]
        # Same world size: each rank continues its own streams; otherwise a best effort.
        self.rng = states[rank() % len(states)]

    def restore_rng_once(self) -> None:
        """Put back the resumed RNG streams (once, after the first epoch is positioned)."""
        if self.rng is not None:
            restore_rng(self.rng, self.device)
            self.rng = None

    def finished(self) -> bool:
        """True once ``max_steps`` steps or ``max_epochs`` epochs are done."""
        cfg = self.config
        if cfg.max_steps is not None:
            return self.step >= cfg.max_steps
        return self.epoch >= (cfg.max_epochs or 0)

    def at_step_end(self) -> None:
        """Log every ``log_every`` steps, and before each checkpoint so none saves a NaN model."""
        cfg, step, final = self.config, self.step, self.finished()
        every = cfg.val_every is not None and step % cfg.val_every == 0
        validate = self.val_loader is not None and (every or final)
        checkpoint = cfg.checkpoint_every is not None and step % cfg.checkpoint_every == 0
        checkpoint = checkpoint or (final and cfg.checkpoint_at_end)
        if step % cfg.log_every == 0 or checkpoint or validate or final:
            self._report(validate)
        if checkpoint:
            self._checkpoint()

    def at_end(self) -> None:
        """Report what the last window and a final validation saw; save the final checkpoint."""
        validate = self.val_loader is not None and self.validated_step != self.step
        if self.window.losses or validate:
            self._report(validate=validate)
        if self.config.checkpoint_at_end and self.checkpointed_step != self.step:
            self._checkpoint()
        barrier()  # every rank returns only once rank zero's checkpoint is on disk

    def _report(self, validate: bool) -> None:
        cfg = self.config
        if self.window.losses:
            loss, samples_per_s = self.window.reduce(self.logged_step + 1, cfg.accumulate)
            per_device = samples_per_s / get_world_size()
            mfu = self.flops * per_device / self.peak if self.flops and self.peak else None
            self.metrics.update(loss=loss, samples_per_s=samples_per_s, mfu=mfu)
        self.logged_step = self.step
        self.metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        if validate:
            self.metrics.update(self._validate())
            self.validated_step = self.step
        fields = {"step": self.step, "total": self.total, "epoch": self.epoch, **self.metrics}
        self.history.append({"step": self.step, **self.metrics})
        self.display.update(fields)
        self.window.restart_clock()

    def _validate(self) -> Metrics:
        """Mean of each validation metric over batches and ranks; leaves the training RNG alone."""
        loader = self.val_loader
        if loader is None:
            return {}
        sums: dict[str, torch.Tensor] = {}
        batches = 0
        self.module.eval()
        forked = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=forked), torch.no_grad():
            for batch in loader:
                with self.autocast():
                    out = self.module.validation_step(to_device(batch, self.device))
                out = check_validation_step(out, self.module)  # host-side facts only, no sync
                for key, value in out.items():
                    value = value.detach().float()
                    sums[key] = sums[key] + value if key in sums else value
                batches += 1
        self.module.train()
        keys = sorted(sums)
        count = torch.tensor(float(batches), device=self.device)
        packed = torch.stack([sums[key] for key in keys] + [count])
        if get_world_size() > 1:
            dist.all_reduce(packed)
        *values, total = packed.tolist()
        return {f"val_{key}": value / total for key, value in zip(keys, values, strict=True)}

    def _checkpoint(self) -> None:
        """Gather every rank's RNG, save on rank zero, prune to ``keep_checkpoints`` files."""
        cfg = self.config
        rng = capture_rng(self.device)
        states: list[Any] = [rng]
        if get_world_size() > 1:
            states = [None] * get_world_size()
            dist.all_gather_object(states, rng)
        directory = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else job.output_dir()
        path = directory / f"step-{self.step:08d}.pt"
        self.last_checkpoint, self.checkpointed_step = path, self.step
        if not is_rank_zero():
            return
        checkpoint = {
            "format": FORMAT,
            "version": VERSION,
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "config": cfg.model_dump(mode="json"),
            "rng": states,
        }
        save_checkpoint(checkpoint, path)
        self.written = [p for p in self.written if p != path] + [path]
        for old in self.written[: -cfg.keep_checkpoints]:
            old.unlink(missing_ok=True)
        self.written = self.written[-cfg.keep_checkpoints :]
        self.window.restart_clock()
