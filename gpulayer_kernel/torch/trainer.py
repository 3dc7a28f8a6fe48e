"""The training loop: ``Trainer(config).fit(module, train_loader)`` on any device, any world size.

:meth:`Trainer.fit` is meant to be read top to bottom; everything that is not the step itself
(setup, metrics, validation, checkpoints, stops) lives in ``run.py``. What a step costs beyond a
hand-written loop: one list append for the loss (and one per ``self.log`` call) and a few Python
branches. It never waits for the device: metrics are reduced every ``log_every`` steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import job
from ..errors import InvalidInput
from ..job.ranks import device, init_distributed, is_rank_zero, print0
from .callbacks import Callback, CallbackList
from .checkpoint import artifact_name
from .config import TrainerConfig
from .data import batch_size_of, epoch_iterator, loader_length, to_device
from .errors import CheckpointInvalid, NoTrainingData
from .loggers import CSVLogger, Logger
from .loops import evaluate, predict, require_hook
from .model_checkpoint import ModelCheckpoint
from .module import Module
from .precision import autocast_for, determinism
from .resume import resolve
from .run import _limit, _Run
from .strategies import Strategy

Metrics = dict[str, float | None]


@dataclass(frozen=True)
class FitResult:
    """What :meth:`Trainer.fit` did: where it stopped, its last metrics, its checkpoints.

    ``step`` counts optimizer steps done; ``epoch`` is the 0-based epoch counter, which
    advances when an epoch's data runs out; ``metrics`` are the last reduced values (``loss``,
    ``samples_per_s``, ``mfu``, ``lr``, ``val_*``, and what ``self.log`` recorded);
    ``checkpoint`` is the newest file saved (None when none was). Inside a GPUlayer job the
    paths are scratch paths, gone when the job ends; ``artifact`` / ``best_artifact`` are the
    names they come back under (``gpulayer artifacts JOB --get NAME``).
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
    #: the best checkpoint of a ModelCheckpoint with a monitor, and its artifact name
    best_checkpoint: Path | None = None
    best_artifact: str | None = None
    #: why the fit ended before its max_steps/max_epochs (early stopping, max_time), or None
    stopped: str | None = None

    def plot(self, metrics: Sequence[str] | None = None, ax: Any = None) -> Any:
        """Draw the history with matplotlib (loss-like metrics left, others right); a Figure."""
        from .plot import plot_history

        return plot_history(self.history, metrics, ax)


class Trainer:
    """Trains a :class:`Module` as its :class:`TrainerConfig` says; reusable across fits.

    ``Trainer(TrainerConfig(max_steps=1000))`` or, the same, ``Trainer(max_steps=1000)``.
    ``callbacks`` run in the given order (callbacks.py); ``loggers`` default to one
    :class:`CSVLogger` (``[]``: none). While a fit runs, callbacks read the live state here:
    ``step``, ``epoch``, ``metrics``, ``should_stop``.
    """

    def __init__(
        self,
        config: TrainerConfig | None = None,
        *,
        callbacks: Iterable[Callback] = (),
        loggers: Iterable[Logger] | None = None,
        **fields: Any,
    ) -> None:
        if config is None:
            config = TrainerConfig(**fields)
        elif fields:
            raise InvalidInput(
                f"Trainer got a TrainerConfig and fields ({', '.join(sorted(fields))})",
                hint="put the fields in the TrainerConfig, or pass fields only",
            )
        self.config = config
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise InvalidInput(
                    f"callbacks must subclass gpulayer_kernel.torch.Callback; got "
                    f"{type(cb).__name__}",
                    hint="class MyCallback(Callback): def on_train_batch_end(self, trainer, "
                    "module, loss, batch): ...",
                )
        self.loggers: list[Logger] = [CSVLogger()] if loggers is None else list(loggers)
        for logger in self.loggers:
            if not isinstance(logger, Logger):
                raise InvalidInput(
                    f"{type(logger).__name__} is not a logger: it needs log_hyperparams, "
                    "log_metrics and finalize",
                    hint="use CSVLogger(), TensorBoardLogger(), or implement the Logger protocol",
                )
        self.should_stop = False
        self.stop_reason: str | None = None
        self._run: _Run | None = None
        self._checkpointers: list[ModelCheckpoint] = []

    # -- the live state callbacks read -----------------------------------------------------------

    @property
    def step(self) -> int:
        return self._run.step if self._run else 0

    global_step = step  # Lightning's name

    @property
    def epoch(self) -> int:
        return self._run.epoch if self._run else 0

    current_epoch = epoch  # Lightning's name

    @property
    def metrics(self) -> Metrics:
        """The last reduced metrics (host floats: reading them never syncs the device)."""
        return self._run.metrics if self._run else {}

    @property
    def device(self) -> torch.device:
        return self._run.device if self._run else device()

    @property
    def validates(self) -> bool:
        """True when this fit validates (a val_loader was given)."""
        return self._run is not None and self._run.val_loader is not None

    @property
    def checkpoint_dir(self) -> Path:
        cfg = self.config
        return Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else job.output_dir()

    def save_checkpoint(self, path: str | Path) -> Path:
        """Save the fit's state to ``path`` (collective: call it on every rank)."""
        if self._run is None:
            raise InvalidInput(
                "save_checkpoint() saves a running fit; none is running",
                hint="call it from a callback, during fit()",
            )
        return self._run.save(Path(path))

    def fit_callbacks(self) -> tuple[CallbackList, list[ModelCheckpoint]]:
        """The fit's callbacks: the given ones, then the default ModelCheckpoint if none given."""
        cfg = self.config
        checkpointers = [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]
        if cfg.fast_dev_run:
            checkpointers = []
        elif not checkpointers:
            checkpointers = [
                ModelCheckpoint(
                    every_n_steps=cfg.checkpoint_every,
                    keep_newest=cfg.keep_checkpoints,
                    save_at_end=cfg.checkpoint_at_end,
                )
            ]
        others = [cb for cb in self.callbacks if not isinstance(cb, ModelCheckpoint)]
        self._checkpointers = checkpointers
        return CallbackList([*others, *checkpointers]), checkpointers

    def best_and_last(self) -> tuple[str | None, str | None]:
        """Paths of the best (monitored) and newest checkpoints this Trainer's fits saved."""
        best = next((c.best_model_path for c in self._checkpointers if c.best_model_path), None)
        last = next((c.last_model_path for c in self._checkpointers if c.last_model_path), None)
        return best, last

    # -- fit --------------------------------------------------------------------------------------

    def fit(
        self,
        module: Module,
        train_loader: Iterable[Any],
        val_loader: Iterable[Any] | None = None,
        ckpt_path: str | Path | Mapping[str, Any] | None = None,
        *,
        resume: str | Path | Mapping[str, Any] | None = None,
        override: Iterable[str] = (),
    ) -> FitResult:
        """Train ``module`` on ``train_loader`` (re-iterable: a DataLoader, a list of batches).

        ``ckpt_path`` (a checkpoint file or dict, ``"last"``, ``"best"``, an artifact name,
        ``"JOB_ID:ARTIFACT"``; ``resume`` is the same) continues exactly where that checkpoint
        left off, data order included; a changed config field that changes the maths raises
        :class:`ConfigChanged` unless ``override`` names it. Raises :class:`LossNotFinite`
        naming the first bad step, :class:`CallbackFailed` naming a callback that raised.
        """
        if ckpt_path is not None and resume is not None:
            raise InvalidInput(
                "fit() got both ckpt_path and resume", hint="pass one (they mean the same)"
            )
        cfg = self.config
        init_distributed()
        self.should_stop, self.stop_reason = False, None
        run = _Run.start(
            self, module, device(), train_loader, val_loader, ckpt_path or resume, override
        )
        self._run = run
        module._gl_metrics = run.log  # self.log in training_step lands here
        module._gl_manual = run.manual  # self.optimizers() and manual_backward() read it
        try:
            with determinism(cfg.deterministic):
                run.hyperparams()
                run.callbacks.call("on_fit_start", self, module)
                while not run.finished():
                    batches = epoch_iterator(train_loader, run.epoch, cfg.seed, run.batch_in_epoch)
                    run.restore_rng_once()  # on resume: only now that the data is positioned
                    for batch in run.epoch_batches(batches):
                        batch = to_device(batch, run.device)
                        run.batch_in_epoch += 1
                        if run.manual is not None:  # the step does its own backward and steps
                            with run.autocast():
                                loss = run.train_step(batch)
                            run.window.add(loss, batch_size_of(batch))
                            run.step += 1
                            run.at_step_end(loss, batch)
                            if run.finished():
                                break
                            continue
                        run.pending = (run.pending + 1) % cfg.accumulate  # 0: step after this
                        # Accumulation micro-batches skip the gradient reduction (no_sync).
                        with run.no_sync() if run.pending else nullcontext():
                            with run.autocast():
                                loss = run.train_step(batch)
                            run.window.add(loss, batch_size_of(batch))  # no .item(): no sync
                            scaled = loss / cfg.accumulate if cfg.accumulate > 1 else loss
                            run.scaler.scale(scaled).backward()  # type: ignore[no-untyped-call]
                        if run.pending:
                            continue
                        if run.before_step is not None:
                            run.first_optimizer_step()  # DDP: names unused parameters
                        if cfg.grad_clip is not None:
                            run.scaler.unscale_(run.optimizer)
                            torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
                        run.scaler.step(run.optimizer)
                        run.scaler.update()
                        run.optimizer.zero_grad(set_to_none=True)
                        run.step += 1
                        run.at_step_end(loss, batch)  # scheduler; log, validate, save when due
                        if run.finished():
                            break
                    else:  # the epoch ran out
                        if run.batch_in_epoch == 0:
                            raise NoTrainingData(
                                f"train_loader yielded no batches in epoch {run.epoch}",
                                hint="check the dataset's length, batch_size and drop_last",
                            )
                        run.at_epoch_end()
                run.at_end()
        except BaseException as error:
            run.callbacks.exception(self, module, error)
            run.finalize("failed")
            raise
        finally:
            run.display.close()
            module._gl_metrics = module._gl_manual = None
        if run.timed_out:
            print0(f"gpulayer: {self.stop_reason}")
        return self._result(run)

    def _result(self, run: _Run) -> FitResult:
        saved = run.last_checkpoint
        best_path, _ = self.best_and_last()
        best = Path(best_path) if best_path else None
        return FitResult(
            run.step,
            run.epoch,
            dict(run.metrics),
            saved,
            list(run.history),
            artifact=artifact_name(saved) if saved is not None else None,
            best_checkpoint=best,
            best_artifact=artifact_name(best) if best is not None else None,
            stopped=self.stop_reason,
        )

    # -- evaluation loops ---------------------------------------------------------------------

    def validate(
        self, module: Module, loader: Iterable[Any], ckpt_path: str | Path | None = None
    ) -> dict[str, float]:
        """Mean validation metrics over ``loader`` (and ranks), as ``val_<key>``."""
        require_hook(module, "validation_step", "validate()")
        return self._evaluate(module, loader, ckpt_path, "validation_step")

    def test(
        self, module: Module, loader: Iterable[Any], ckpt_path: str | Path | None = None
    ) -> dict[str, float]:
        """Mean ``test_step`` metrics over ``loader`` (and ranks), as ``test_<key>``.

        ``ckpt_path="best"`` tests the best checkpoint of this Trainer's last fit.
        """
        require_hook(module, "test_step", "test()")
        return self._evaluate(module, loader, ckpt_path, "test_step")

    def predict(
        self, module: Module, loader: Iterable[Any], ckpt_path: str | Path | None = None
    ) -> list[Any]:
        """``predict_step`` of every batch of ``loader`` on this rank, in order."""
        require_hook(module, "predict_step", "predict()")
        dev = self._prepare(module, ckpt_path)
        autocast = autocast_for(self.config.precision, dev)
        call = self._strategy_of(module).hook("predict_step")
        return predict(module, loader, dev, autocast, self._val_limit(loader), call)

    def _strategy_of(self, module: Module) -> Strategy:
        """The strategy of this Trainer's last fit of ``module`` (FSDP keeps it sharded)."""
        if self._run is not None and self._run.module is module:
            return self._run.strategy
        return Strategy(module, device(), self.config)

    def _prepare(self, module: Module, ckpt_path: str | Path | None) -> torch.device:
        init_distributed()
        dev = device()
        module.to(dev)
        if ckpt_path is not None:
            checkpoint = resolve(ckpt_path, self.checkpoint_dir, *self.best_and_last())
            if "model" not in checkpoint:
                raise CheckpointInvalid(
                    f"{ckpt_path} is a sharded checkpoint: evaluation loads full ones",
                    hint="evaluate with checkpoint_format='full', or load the shards with "
                    "torch.distributed.checkpoint.load first",
                )
            self._strategy_of(module).load_model(checkpoint["model"])
        return dev

    def _evaluate(
        self, module: Module, loader: Iterable[Any], ckpt_path: str | Path | None, hook: str
    ) -> dict[str, float]:
        dev = self._prepare(module, ckpt_path)
        autocast = autocast_for(self.config.precision, dev)
        with determinism(self.config.deterministic):
            metrics = evaluate(
                module,
                loader,
                dev,
                autocast,
                hook,
                self._val_limit(loader),
                call=self._strategy_of(module).hook(hook),
            )
        if is_rank_zero():
            shown = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            print0(f"{hook.removesuffix('_step')}: {shown}")
            for logger in self.loggers:
                logger.log_metrics(dict(metrics), self.step)
        return metrics

    def _val_limit(self, loader: Iterable[Any]) -> int | None:
        limit = self.config.fast_dev_run or self.config.limit_val_batches
        return _limit(limit, loader_length(loader), "limit_val_batches")
