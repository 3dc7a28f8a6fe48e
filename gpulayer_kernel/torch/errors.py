"""Errors of the training API, as branches of GPUlayer's one hierarchy (``gpulayer_kernel.errors``).

GPUlayerError
├── InvalidInput (400 invalid_input)
│   ├── PrecisionUnsupported (400 precision_unsupported)        e.g. '16-mixed' on a CPU
│   ├── CheckpointInvalid (422 checkpoint_invalid)              not a GPUlayer checkpoint, too new
│   ├── NoTrainingData (400 no_training_data)                   no batch, or too few for a step
│   ├── TrainingStepInvalid (400 training_step_invalid)         None, a float, a non-scalar
│   ├── ValidationStepInvalid (400 validation_step_invalid)     not a dict of scalar tensors
│   ├── OptimizersInvalid (400 configure_optimizers_invalid)    Lightning-style lists
│   │   └── SchedulerUnsupported (400 scheduler_unsupported)    ReduceLROnPlateau without monitor
│   ├── MetricInvalid (400 metric_invalid)                      self.log of a vector, a str, ...
│   ├── MetricNotFound (400 metric_not_found)                   a monitored metric never logged
│   ├── CallbackInvalid (400 callback_invalid)                  save_top_k without monitor, ...
│   ├── ConfigChanged (409 config_changed)                      resume under a different config
│   ├── HookMissing (400 hook_missing)                          predict() without predict_step
│   ├── DependencyMissing (400 dependency_missing)              TensorBoard / matplotlib absent
│   ├── UnusedParameters (400 unused_parameters)                DDP: parameters outside the loss
│   └── ManualOptimizationInvalid (400 manual_optimization_invalid)  a Trainer option it can't use
├── CallbackFailed (500 callback_failed)                        a callback raised: names it
└── LossNotFinite (500 loss_not_finite)                         training diverged at a named step

The contract errors (``*Invalid``, ``SchedulerUnsupported``) name the hook and what it returned
(``details = {"method", "returned"}``); ``contract.py`` raises them before or at the first step.
The others name the metric, callback, field or package at fault in ``details``.
"""

from __future__ import annotations

from ..errors import GPUlayerError, InvalidInput


class PrecisionUnsupported(InvalidInput):
    """The configured precision cannot run on this device."""

    code = "precision_unsupported"
    status = 400


class CheckpointInvalid(InvalidInput):
    """A file or dict given to ``resume`` is not a checkpoint this version can load."""

    code = "checkpoint_invalid"
    status = 422


class NoTrainingData(InvalidInput):
    """An epoch of ``train_loader`` produced no batches, so training could never progress."""

    code = "no_training_data"
    status = 400


class TrainingStepInvalid(InvalidInput):
    """``training_step`` returned something other than a scalar loss tensor with a gradient."""

    code = "training_step_invalid"
    status = 400


class ValidationStepInvalid(InvalidInput):
    """``validation_step`` returned something other than a dict of scalar tensors."""

    code = "validation_step_invalid"
    status = 400


class OptimizersInvalid(InvalidInput):
    """``configure_optimizers`` returned something other than an optimizer or a pair."""

    code = "configure_optimizers_invalid"
    status = 400


class SchedulerUnsupported(OptimizersInvalid):
    """A scheduler the Trainer cannot step: ``ReduceLROnPlateau`` with no ``monitor``."""

    code = "scheduler_unsupported"
    status = 400


class MetricInvalid(InvalidInput):
    """``self.log`` got a value that is not a scalar: a vector, a string, a list, None."""

    code = "metric_invalid"
    status = 400


class MetricNotFound(InvalidInput):
    """A callback or scheduler monitors a metric that was never logged."""

    code = "metric_not_found"
    status = 400


class CallbackInvalid(InvalidInput):
    """A callback was configured in a way that cannot work (``save_top_k`` with no monitor)."""

    code = "callback_invalid"
    status = 400


class ConfigChanged(InvalidInput):
    """Resuming under a TrainerConfig whose exactness-relevant fields differ from the saved one."""

    code = "config_changed"
    status = 409


class HookMissing(InvalidInput):
    """A loop needs a hook the module does not define (``predict_step``, ``test_step``)."""

    code = "hook_missing"
    status = 400


class DependencyMissing(InvalidInput):
    """An optional package a feature needs is not installed (tensorboard, matplotlib)."""

    code = "dependency_missing"
    status = 400


class UnusedParameters(InvalidInput):
    """Under DDP, parameters that require grad took no part in the loss; names them."""

    code = "unused_parameters"
    status = 400


class ManualOptimizationInvalid(InvalidInput):
    """``automatic_optimization = False`` with an option only automatic optimization has."""

    code = "manual_optimization_invalid"
    status = 400


class CallbackFailed(GPUlayerError):
    """A callback raised; names the callback and the hook. The cause is ``__cause__``."""

    code = "callback_failed"
    status = 500


class LossNotFinite(GPUlayerError):
    """The loss became NaN or infinite; carries the first bad optimizer step (1-based)."""

    code = "loss_not_finite"
    status = 500

    def __init__(self, step: int, bad_rank: int, value: float | None) -> None:
        what = f"loss is {value}" if value is not None else f"loss is not finite on rank {bad_rank}"
        super().__init__(
            f"{what} at step {step}; training stopped",
            hint="lower the learning rate, set grad_clip, check the data of that step, or use "
            "precision='bf16-mixed' instead of '16-mixed'; resume from a checkpoint saved "
            "before that step",
            details={"step": step, "rank": bad_rank},
        )
        self.step = step
        self.rank = bad_rank
