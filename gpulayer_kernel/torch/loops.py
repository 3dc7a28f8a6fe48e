"""The evaluation loops: validation and test (metrics), and predict (outputs).

Each runs with the module in eval mode under ``torch.no_grad()`` and a forked RNG, so adding a
validation never changes the trained weights; the module is back in train mode afterwards.
Metrics (returned dicts and ``self.log`` calls alike) are summed on the device over the run and
reduced with one all_reduce and one host copy at its end.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from ..job.ranks import world_size
from .contract import check_validation_step
from .data import to_device
from .errors import HookMissing, ValidationStepInvalid
from .metrics import MetricLog
from .module import Module, has_hook

Autocast = Callable[[], AbstractContextManager[Any]]


def require_hook(module: Module, hook: str, loop: str) -> None:
    """Raise :class:`HookMissing` when ``module`` does not define ``hook``."""
    if not has_hook(module, hook):
        name = type(module).__name__
        raise HookMissing(
            f"{loop} needs {name}.{hook}, which {name} does not define",
            hint=f"define {hook}(self, batch) on {name}"
            + (
                " returning the prediction for the batch"
                if hook == "predict_step"
                else " returning {'loss': ..., 'acc': ...} (or calling self.log)"
            ),
            details={"method": hook, "module": name},
        )


class _Evaluating:
    """Eval mode, no grad, a forked RNG and a MetricLog on the module, restored on exit."""

    def __init__(self, module: Module, device: torch.device, stage: str) -> None:
        self.module, self.device, self.stage = module, device, stage
        self.log = MetricLog(device, stage)

    def __enter__(self) -> MetricLog:
        self.previous, self.was_training = self.module._gl_metrics, self.module.training
        self.module._gl_metrics = self.log
        self.module.eval()
        forked = [self.device.index or 0] if self.device.type == "cuda" else []
        self.rng = torch.random.fork_rng(devices=forked)
        self.rng.__enter__()
        self.grad = torch.no_grad()
        self.grad.__enter__()
        return self.log

    def __exit__(self, *exc: Any) -> None:
        self.grad.__exit__(*exc)
        self.rng.__exit__(*exc)
        self.module._gl_metrics = self.previous
        self.module.train(self.was_training)


def evaluate(
    module: Module,
    loader: Iterable[Any],
    device: torch.device,
    autocast: Autocast,
    hook: str = "validation_step",
    limit: int | None = None,
    hidden: set[str] | None = None,
    call: Callable[[Any], Any] | None = None,
) -> dict[str, float]:
    """Mean of each metric over batches and ranks: returned dicts as ``val_``/``test_<key>``,
    ``self.log`` values under their own names. At most ``limit`` batches per rank; the names
    logged without ``prog_bar`` are added to ``hidden``. ``call`` runs the hook on a batch
    (FSDP: through the sharded root, which gathers the parameters); default: the module's."""
    prefix = "val_" if hook == "validation_step" else "test_"
    step = call or getattr(module, hook)
    sums: dict[str, torch.Tensor] = {}
    batches = 0
    with _Evaluating(module, device, hook) as log:
        for batch in itertools.islice(loader, limit):
            with autocast():
                out = step(to_device(batch, device))
            out = check_validation_step(out, module, hook)  # host-side facts only, no sync
            for key, value in out.items():
                value = value.detach().float().reshape(())
                sums[key] = sums[key] + value if key in sums else value
            batches += 1
    keys = sorted(sums)
    synced, synced_t, local, local_t = log.pack()
    count = torch.tensor([float(batches)], device=device)
    returned = torch.stack([sums[key] for key in keys]) if keys else count.new_zeros(0)
    packed = torch.cat([returned, count, synced_t.to(device)])
    if world_size() > 1:
        dist.all_reduce(packed)
    host = torch.cat([packed, local_t.to(device)]).tolist()  # the run's one host copy
    total = host[len(keys)]
    out_metrics = {
        f"{prefix}{key}": host[i] / total if total else float("nan") for i, key in enumerate(keys)
    }
    out_metrics.update(log.unpack(synced, local, host[len(keys) + 1 :]))
    if hidden is not None:
        hidden |= log.hidden_names()
    if total and not out_metrics:
        raise ValidationStepInvalid(
            f"{type(module).__name__}.{hook} returned None and logged nothing over "
            f"{int(total)} batch(es): there is nothing to report",
            hint=f"return {{'loss': loss}} from {hook}, or call self.log('{prefix}loss', loss)",
            details={"method": hook, "returned": "None"},
        )
    return out_metrics


def predict(
    module: Module,
    loader: Iterable[Any],
    device: torch.device,
    autocast: Autocast,
    limit: int | None = None,
    call: Callable[[Any], Any] | None = None,
) -> list[Any]:
    """``predict_step`` of every batch (this rank's batches), in order, as returned."""
    step = call or module.predict_step
    outputs = []
    with _Evaluating(module, device, "predict"):
        for batch in itertools.islice(loader, limit):
            with autocast():
                outputs.append(step(to_device(batch, device)))
    return outputs
