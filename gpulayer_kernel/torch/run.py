"""The state of one fit and everything around the step: metrics, validation, checkpoints, stops.

:class:`Trainer.fit` (trainer.py) is the loop; it calls :meth:`_Run.at_step_end` after each
optimizer step and :meth:`_Run.at_epoch_end` when the data runs out. Those decide, from step
counts only (the same on every rank), when to reduce metrics (one host copy per log interval),
validate, save and stop; callbacks hear about each (callbacks.py has the order).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..errors import InvalidInput
from ..job.ranks import barrier, is_rank_zero, rank, seed_everything
from ..job.ranks import world_size as get_world_size
from .callbacks import CallbackList, Trainer
from .checkpoint import (
    FORMAT,
    SHARDED_REST,
    VERSION,
    capture_rng,
    restore_rng,
    save_checkpoint,
)
from .contract import (
    check_fit,
    check_manual_step,
    check_optimizers,
    check_train_loader,
    check_training_step,
)
from .data import loader_length
from .loggers import Logger
from .loops import evaluate
from .manual import ManualOptimization, broadcast_module, setup_manual
from .metrics import MetricLog
from .model_checkpoint import ModelCheckpoint
from .module import Module
from .precision import autocast_for
from .progress import MetricWindow, ProgressDisplay, peak_flops
from .resume import check_config, resolve
from .scheduling import ScheduledLR
from .strategies import FSDPStrategy, Strategy, make_strategy


class _Owner(Trainer, Protocol):
    """What a fit needs of its Trainer beyond what callbacks see."""

    loggers: list[Logger]

    def fit_callbacks(self) -> tuple[CallbackList, list[ModelCheckpoint]]: ...
    def best_and_last(self) -> tuple[str | None, str | None]: ...


Metrics = dict[str, float | None]
#: progress fields that are bookkeeping, not metrics (never hidden, never charted as a loss)
_ALWAYS_SHOWN = ("loss", "samples_per_s", "mfu", "lr")


def _limit(value: int | float | None, batches: int | None, field_name: str) -> int | None:
    if value is None or isinstance(value, int):
        return value
    if batches is None:
        raise InvalidInput(
            f"{field_name}={value} is a fraction, but the loader has no length",
            hint=f"pass a count of batches ({field_name}=100)",
            details={"field": field_name},
        )
    return max(1, int(batches * value))


@dataclass(eq=False)
class _Run:
    """The state of one fit: what to train, with what, where it has got to, what it reported."""

    trainer: _Owner
    module: Module
    device: torch.device
    optimizer: torch.optim.Optimizer
    scheduler: ScheduledLR | None
    scaler: torch.amp.GradScaler
    strategy: Strategy
    train_step: Callable[[Any], torch.Tensor]
    no_sync: Callable[[], AbstractContextManager[Any]]
    autocast: Callable[[], AbstractContextManager[Any]]
    manual: ManualOptimization | None  # automatic_optimization = False: the step's own steps
    before_step: Callable[[], None] | None  # once, before the first optimizer step
    val_loader: Iterable[Any] | None
    params: list[torch.nn.Parameter]
    callbacks: CallbackList
    checkpointers: list[ModelCheckpoint]
    loggers: list[Logger]
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    pending: int = 0  # micro-batches whose gradients wait for the next optimizer step
    rng: dict[str, Any] | None = None  # RNG to restore once the resumed epoch is positioned
    metrics: Metrics = field(default_factory=dict)
    hidden: set[str] = field(default_factory=set)  # logged without prog_bar: not in progress
    history: list[dict[str, float | int | None]] = field(default_factory=list)
    window: MetricWindow = field(default_factory=MetricWindow)
    log: MetricLog = field(default_factory=lambda: MetricLog(torch.device("cpu")))
    display: ProgressDisplay = field(default_factory=ProgressDisplay)
    last_checkpoint: Path | None = None
    logged_step: int = 0  # the step of the last reduction: the window starts after it
    validated_step: int = -1
    total: int | None = None  # steps in the whole fit, when the loader has a length
    max_steps: int | None = None
    max_epochs: int | None = None
    train_limit: int | None = None  # batches per epoch
    val_limit: int | None = None
    deadline: float | None = None  # time.monotonic() at which max_time is up
    timed_out: bool = False
    no_loss: bool = False  # a manual training_step returns None: "loss" is not known
    epoch_report: bool = False  # something reads metrics at each epoch's end: reduce there
    flops: float | None = None  # training FLOPs per sample, for MFU
    peak: float | None = None  # the device's peak FLOP/s, for MFU

    @classmethod
    def start(
        cls,
        trainer: _Owner,
        module: Module,
        dev: torch.device,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None,
        source: str | Path | Mapping[str, Any] | None,
        override: Iterable[str],
    ) -> _Run:
        """Check the inputs, move the module, build optimizers, then seed or restore state."""
        cfg = trainer.config
        check_fit(module, val_loader, cfg, dev)
        check_train_loader(train_loader, cfg)
        callbacks, checkpointers = trainer.fit_callbacks()
        checkpoint = None
        if source is not None:
            checkpoint = resolve(source, trainer.checkpoint_dir, *trainer.best_and_last())
            check_config(checkpoint.get("config"), cfg, override)  # before touching the module
        else:
            seed_everything(cfg.seed + rank())  # distinct dropout masks per rank
        module.to(dev)
        module.train()
        if checkpoint is not None and "model" in checkpoint:
            module.load_state_dict(checkpoint["model"])  # before sharding: a full state
        scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "16-mixed")
        if cfg.compile:
            module.compile()  # compiles __call__ in place: self(...) in the hooks is compiled
        manual = None
        if not module.automatic_optimization:
            manual = setup_manual(module, module.configure_optimizers(), cfg, scaler)
            broadcast_module(module)  # the replicas start equal, as DDP would make them
            strategy = Strategy(module, dev, cfg)  # no DDP: each opt.step() averages gradients
            optimizer, scheduler = manual.raw[0], None
        else:
            # The optimizer is built after sharding: FSDP's optimizer must hold the shards.
            strategy = make_strategy(module, dev, cfg)
            optimizer, scheduler = check_optimizers(module.configure_optimizers(), module)
        run = cls(
            trainer=trainer,
            module=module,
            device=dev,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            strategy=strategy,
            train_step=strategy.train_step,  # replaced just below, by a check of the first call
            no_sync=strategy.no_sync,
            autocast=autocast_for(cfg.precision, dev),
            manual=manual,
            before_step=strategy.before_first_step,
            val_loader=val_loader,
            params=[p for p in module.parameters() if p.requires_grad],
            callbacks=callbacks,
            checkpointers=checkpointers,
            loggers=[] if cfg.fast_dev_run else trainer.loggers,
            log=MetricLog(dev),
        )
        run.train_step = functools.partial(run._first_train_step, strategy.train_step)
        run.epoch_report = (scheduler is not None and scheduler.interval == "epoch") or any(
            not (
                isinstance(cb, ModelCheckpoint) and cb.every_n_epochs is None and cb.monitor is None
            )
            for cb in callbacks.by_hook["on_train_epoch_end"]
        )
        if checkpoint is not None:
            run._load(checkpoint)
        run._plan(train_loader, val_loader)
        run.flops = module.flops_per_sample()
        run.peak = peak_flops(dev) if run.flops else None
        return run

    def _plan(self, train_loader: Iterable[Any], val_loader: Iterable[Any] | None) -> None:
        """Lengths and limits: max steps/epochs, batches per epoch, the deadline, the total."""
        cfg = self.trainer.config
        batches = loader_length(train_loader)
        self.max_steps, self.max_epochs = cfg.max_steps, cfg.max_epochs
        self.train_limit = _limit(cfg.limit_train_batches, batches, "limit_train_batches")
        val_batches = loader_length(val_loader) if val_loader is not None else None
        self.val_limit = _limit(cfg.limit_val_batches, val_batches, "limit_val_batches")
        if cfg.fast_dev_run:
            self.max_steps, self.max_epochs = None, 1
            self.train_limit = self.val_limit = cfg.fast_dev_run * cfg.accumulate
        if cfg.max_time is not None:
            self.deadline = time.monotonic() + cfg.max_time
        if self.train_limit is not None and batches is not None:
            batches = min(batches, self.train_limit)
        self.total = self.max_steps
        if self.max_epochs is not None and batches is not None:
            self.total = batches * self.max_epochs // cfg.accumulate

    def _first_train_step(self, step: Callable[[Any], Any], batch: Any) -> torch.Tensor:
        """Run and check the first call of ``training_step``; later calls skip the check."""
        if self.manual is not None:
            returned = check_manual_step(step(batch), self.module)
            self.no_loss = returned is None  # a step that returns nothing: no loss to show
            placeholder = torch.zeros((), device=self.device)
            step = functools.partial(_manual_loss, step, self.no_loss, placeholder)
            loss = placeholder if returned is None else returned.detach()
        else:
            loss = check_training_step(step(batch), self.module)
        self.train_step = step  # from now on the bare call: the check costs nothing per step
        return loss

    def first_optimizer_step(self) -> None:
        """What the strategy checks once, after the first backward (DDP: unused parameters)."""
        self.before_step = None
        self.strategy.before_first_step()

    def _load(self, checkpoint: dict[str, Any]) -> None:
        """Take optimizer, scheduler, scaler, callbacks' state and position from a checkpoint."""
        if isinstance(self.strategy, FSDPStrategy) and "sharded" in checkpoint:
            self.strategy.load_sharded(self.optimizer, checkpoint["sharded"])
        elif self.manual is not None:
            for optimizer, state in zip(self.manual.raw, checkpoint["optimizers"], strict=True):
                optimizer.load_state_dict(state)
            states = checkpoint.get("schedulers", [])
            for scheduler, state in zip(self.manual.schedulers, states, strict=True):
                scheduler.load_state_dict(state)
        else:
            self.strategy.load_optimizer(self.optimizer, checkpoint["optimizer"])
        if self.scheduler is not None and checkpoint.get("scheduler") is not None:
            self.scheduler.scheduler.load_state_dict(checkpoint["scheduler"])
        if checkpoint.get("scaler") is not None:
            self.scaler.load_state_dict(checkpoint["scaler"])
        self.callbacks.load(checkpoint.get("callbacks"))
        self.step = self.logged_step = self.validated_step = int(checkpoint["step"])
        for c in self.checkpointers:
            c.saved_step = self.step
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

    def epoch_batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The epoch's remaining batches, cut at ``limit_train_batches``."""
        if self.train_limit is None:
            return batches
        return itertools.islice(batches, max(0, self.train_limit - self.batch_in_epoch))

    def finished(self) -> bool:
        """True once steps, epochs or time are used up, or a callback asked to stop."""
        if self.trainer.should_stop or self.timed_out:
            return True
        if self.deadline is not None and get_world_size() == 1 and time.monotonic() > self.deadline:
            self._time_up()
            return True
        if self.max_steps is not None:
            return self.step >= self.max_steps
        return self.max_epochs is not None and self.epoch >= self.max_epochs

    def _time_up(self) -> None:
        self.timed_out = True
        cfg = self.trainer.config
        self.trainer.stop_reason = f"max_time of {cfg.max_time:g}s reached at step {self.step}"

    def at_step_end(self, loss: torch.Tensor, batch: Any) -> None:
        """Step the scheduler; log every ``log_every`` steps and before each checkpoint and
        validation (so none saves a NaN model); validate, save, tell the callbacks."""
        cfg, step = self.trainer.config, self.step
        if self.scheduler is not None and self.scheduler.due("step", step):
            self.scheduler.step(self.metrics)
        final = self.finished()
        every = cfg.val_every is not None and step % cfg.val_every == 0
        validate = self.val_loader is not None and (every or final)
        due = [c for c in self.checkpointers if c.due_at_step(step)]
        if step % cfg.log_every == 0 or due or validate or final:
            self.report(validate)
        for c in due:
            c.at_step(self.trainer)
        self.callbacks.call("on_train_batch_end", self.trainer, self.module, loss, batch)

    def at_epoch_end(self) -> None:
        """Epoch aggregates, epoch validation and schedulers, then ``on_train_epoch_end``."""
        cfg = self.trainer.config
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        every = cfg.val_every_epochs
        validate = (
            self.val_loader is not None
            and every is not None
            and self.epoch % every == 0
            and self.validated_step != self.step
        )
        if self.log.epoch_pending() or validate or (self.epoch_report and self.window.losses):
            self.report(validate, epoch_end=True)
        if self.scheduler is not None and self.scheduler.due("epoch", self.epoch):
            self.scheduler.step(self.metrics)
        self.callbacks.call("on_train_epoch_end", self.trainer, self.module)

    def at_end(self) -> None:
        """Report what the last window and a final validation saw; save the final checkpoint."""
        validate = self.val_loader is not None and self.validated_step != self.step
        if self.window.losses or validate:
            self.report(validate=validate)
        for c in self.checkpointers:
            c.at_fit_end(self.trainer)
        barrier()  # every rank returns only once rank zero's checkpoint is on disk
        self.callbacks.call("on_fit_end", self.trainer, self.module)
        self.finalize("success")

    def finalize(self, status: str) -> None:
        if is_rank_zero():
            for logger in self.loggers:
                logger.finalize(status)

    def report(self, validate: bool, epoch_end: bool = False) -> None:
        cfg = self.trainer.config
        if self.window.losses:
            synced, synced_t, local, local_t = self.log.pack()
            late = self.deadline is not None and time.monotonic() > self.deadline
            loss, samples_per_s, values, stop = self.window.reduce(
                self.logged_step + 1, cfg.accumulate, synced_t, local_t, late
            )
            per_device = samples_per_s / get_world_size()
            mfu = self.flops * per_device / self.peak if self.flops and self.peak else None
            self.metrics.update(loss=None if self.no_loss else loss, samples_per_s=samples_per_s)
            self.metrics["mfu"] = mfu
            self.metrics.update(self.log.unpack(synced, local, values))
            self.hidden |= self.log.hidden_names()
            if stop and not self.timed_out:
                self._time_up()  # every rank saw the same flag: they stop at the same step
        if epoch_end:  # after the window: its values are in the epoch's sums now
            self.metrics.update(self.log.epoch_reduce())
        self.logged_step = self.step
        self.metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        if validate:
            self.metrics.update(
                evaluate(
                    self.module,
                    self.val_loader or (),
                    self.device,
                    self.autocast,
                    limit=self.val_limit,
                    hidden=self.hidden,
                    call=self.strategy.hook("validation_step"),
                )
            )
            self.validated_step = self.step
            self.callbacks.call("on_validation_end", self.trainer, self.module)
        self.publish()
        self.window.restart_clock()

    def publish(self) -> None:
        """History, the progress display (widget, panel, text) and the loggers get the metrics."""
        metrics = {k: _finite(v) for k, v in self.metrics.items()}
        self.history.append({"step": self.step, "epoch": self.epoch, **metrics})
        shown = {k: v for k, v in metrics.items() if k not in self.hidden or k in _ALWAYS_SHOWN}
        self.display.update({"step": self.step, "total": self.total, "epoch": self.epoch, **shown})
        if is_rank_zero():
            for logger in self.loggers:
                logger.log_metrics({"epoch": float(self.epoch), **metrics}, self.step)

    def hyperparams(self) -> None:
        if is_rank_zero():
            params = {
                "module": type(self.module).__name__,
                "world_size": get_world_size(),
                **self.trainer.config.model_dump(mode="json"),
            }
            json.dumps(params)  # plain JSON, as loggers expect
            for logger in self.loggers:
                logger.log_hyperparams(params)

    def save(self, path: Path) -> Path:
        """Gather every rank's RNG, let callbacks add state, save on rank zero (atomically).

        Sharded (FSDP): every rank writes its shards into the directory ``path``, then rank
        zero adds ``trainer.pt`` (the rest of the checkpoint), last, so a directory without it
        is an unfinished save."""
        rng = capture_rng(self.device)
        states: list[Any] = [rng]
        if get_world_size() > 1:
            states = [None] * get_world_size()
            dist.all_gather_object(states, rng)
        self.last_checkpoint = path
        sharded = self.trainer.config.checkpoint_format == "sharded"
        checkpoint: dict[str, Any] = {"format": FORMAT, "version": VERSION}
        if sharded and isinstance(self.strategy, FSDPStrategy):
            self.strategy.save_sharded(self.optimizer, str(path))
        else:
            checkpoint["model"] = self.strategy.model_state()  # collective under FSDP
            checkpoint["optimizer"] = self.strategy.optimizer_state(self.optimizer)
        if self.manual is not None:
            checkpoint["optimizers"] = [o.state_dict() for o in self.manual.raw]
            checkpoint["schedulers"] = [s.state_dict() for s in self.manual.schedulers]
        checkpoint.update(
            scheduler=self.scheduler.scheduler.state_dict() if self.scheduler else None,
            scaler=self.scaler.state_dict() if self.scaler.is_enabled() else None,
            step=self.step,
            epoch=self.epoch,
            batch_in_epoch=self.batch_in_epoch,
            config=self.trainer.config.model_dump(mode="json"),
            rng=states,
            callbacks=self.callbacks.state(),
        )
        self.callbacks.call("on_checkpoint", self.trainer, self.module, checkpoint)
        if is_rank_zero():
            save_checkpoint(checkpoint, path / SHARDED_REST if sharded else path)
        self.window.restart_clock()
        return path


def _manual_loss(
    step: Callable[[Any], Any], none: bool, placeholder: torch.Tensor, batch: Any
) -> torch.Tensor:
    """A manual step's loss for the window: its returned tensor, detached, or a placeholder
    (counted for samples/s, reported as no loss) when the first step returned None."""
    loss = step(batch)
    return placeholder if none or loss is None else loss.detach()


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None
