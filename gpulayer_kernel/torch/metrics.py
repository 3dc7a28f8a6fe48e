"""``self.log`` without device syncs: logged values wait on the device until a log boundary.

A call of :meth:`Module.log` checks host-side facts only (type, ``numel``) and appends the
detached tensor to its metric's window: about a microsecond, no ``.item()`` (on a GPU that
stalls the host until the device catches up). At each log boundary the Trainer packs every
window's sum and count into the same tensor as the loss window (``progress.MetricWindow``), so
all metrics together cost one host copy and, across ranks, one ``all_reduce`` for those logged
with ``sync_dist=True``, however many ``self.log`` calls there were. Epoch aggregates fold the
windows' sums into a device tensor at each boundary and are copied at the epoch's end.

Names: ``on_step`` alone reports ``name`` (the mean over the log window), ``on_epoch`` alone
reports ``name`` at each epoch's end (the mean over the epoch), both report ``name_step`` and
``name_epoch`` (Lightning's names). In ``validation_step`` and ``test_step`` every logged value
is averaged over the whole evaluation run and reported under its own name.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..job.ranks import world_size
from .errors import MetricInvalid

Reduced = dict[str, float]


@dataclass(eq=False, slots=True)
class _Metric:
    name: str
    prog_bar: bool
    on_step: bool
    on_epoch: bool
    sync_dist: bool
    window: list[Any] = field(default_factory=list)  # detached tensors or floats
    epoch_sum: torch.Tensor | None = None  # on the device
    epoch_count: int = 0


class MetricLog:
    """The metrics ``self.log`` recorded in one stage (train, validate, test) of a fit."""

    def __init__(self, device: torch.device, stage: str = "train") -> None:
        self.device = device
        # float64 keeps logged values as logged (MPS has no float64: float32 there)
        self.dtype = torch.float32 if device.type == "mps" else torch.float64
        self.stage = stage
        self.metrics: dict[str, _Metric] = {}

    # -- the per-call path: host-side checks and one append ------------------------------------

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool,
        on_step: bool,
        on_epoch: bool,
        sync_dist: bool,
    ) -> None:
        metric = self.metrics.get(name)
        if metric is None:
            metric = self._new(name, prog_bar, on_step, on_epoch, sync_dist)
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise _invalid(name, f"a tensor of shape {tuple(value.shape)}", "reduce it first")
            if value.requires_grad:
                value = value.detach()  # drops the graph: the window must not keep activations
            metric.window.append(value)
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            metric.window.append(float(value))
        else:
            raise _invalid(name, _what(value), "log a number or a one-element tensor")

    def _new(
        self, name: str, prog_bar: bool, on_step: bool, on_epoch: bool, sync_dist: bool
    ) -> _Metric:
        if not isinstance(name, str) or not name:
            raise MetricInvalid(
                f"self.log got the name {name!r}; a metric's name must be a non-empty str",
                hint="call self.log('loss', loss)",
                details={"name": repr(name)},
            )
        if self.stage == "train" and not (on_step or on_epoch):
            raise MetricInvalid(
                f"self.log({name!r}, ..., on_step=False, on_epoch=False) would never report it",
                hint="keep on_step=True (every log interval) or set on_epoch=True",
                details={"name": name},
            )
        metric = _Metric(name, prog_bar, on_step, on_epoch, sync_dist)
        self.metrics[name] = metric
        return metric

    # -- at a log boundary: pack, then unpack after the one host copy ---------------------------

    def pending(self) -> bool:
        return any(m.window for m in self.metrics.values())

    def pack(self) -> tuple[list[_Metric], torch.Tensor, list[_Metric], torch.Tensor]:
        """The windows as ``[sum, count]`` pairs: (synced metrics, their tensor, local, tensor).

        Device work only (stack and sum); the windows are emptied. Epoch metrics fold the
        window into their running sum here, so a window never outlives one log interval.
        """
        synced: list[_Metric] = []
        local: list[_Metric] = []
        parts: dict[bool, list[torch.Tensor]] = {True: [], False: []}
        for metric in self.metrics.values():
            if not metric.window:
                continue
            total = _sum(metric.window, self.device, self.dtype)
            count = len(metric.window)
            metric.window = []
            if metric.on_epoch and self.stage == "train":
                prior = metric.epoch_sum
                metric.epoch_sum = total if prior is None else prior + total
                metric.epoch_count += count
            if self.stage == "train" and not metric.on_step:
                continue  # reported at the epoch's end only
            (synced if metric.sync_dist else local).append(metric)
            parts[metric.sync_dist].append(torch.stack([total, total.new_tensor(float(count))]))
        synced_t, local_t = _cat(parts[True], self), _cat(parts[False], self)
        return synced, synced_t, local, local_t

    def unpack(self, synced: list[_Metric], local: list[_Metric], values: list[float]) -> Reduced:
        """Means from the host copy of ``cat([synced tensor, local tensor])``."""
        out: Reduced = {}
        for i, metric in enumerate([*synced, *local]):
            total, count = values[2 * i], values[2 * i + 1]
            out[self.step_name(metric)] = total / count if count else float("nan")
        return out

    def step_name(self, metric: _Metric) -> str:
        both = self.stage == "train" and metric.on_step and metric.on_epoch
        return f"{metric.name}_step" if both else metric.name

    def epoch_pending(self) -> bool:
        """True when an ``on_epoch`` metric has values of this epoch to report."""
        return any(
            m.on_epoch and (m.epoch_sum is not None or m.window) for m in self.metrics.values()
        )

    def epoch_reduce(self) -> Reduced:
        """The epoch means of ``on_epoch`` metrics (one host copy, one all_reduce if synced).

        Call it after the last window of the epoch was reduced (``pack``): windows still
        holding values here would have their step values folded into the epoch only.
        """
        self.pack()  # only on_epoch-only metrics can still hold values here
        metrics = [m for m in self.metrics.values() if m.epoch_sum is not None]
        if not metrics:
            return {}
        rows = [
            torch.stack([m.epoch_sum, m.epoch_sum.new_tensor(float(m.epoch_count))])
            for m in metrics
            if m.epoch_sum is not None
        ]
        packed = torch.stack(rows).to(self.dtype)
        flags = [m.sync_dist for m in metrics]
        if any(flags) and world_size() > 1:
            mask = torch.tensor(flags, device=packed.device).unsqueeze(1)
            synced = torch.where(mask, packed, 0.0)
            dist.all_reduce(synced)
            packed = torch.where(mask, synced, packed)
        values = packed.tolist()  # the epoch's one host copy
        out: Reduced = {}
        for metric, (total, count) in zip(metrics, values, strict=True):
            name = f"{metric.name}_epoch" if metric.on_step else metric.name
            out[name] = total / count if count else float("nan")
            metric.epoch_sum, metric.epoch_count = None, 0
        return out

    def reduce(self) -> Reduced:
        """Pack, all-reduce the synced part, copy once: for evaluation runs (no loss window)."""
        synced, synced_t, local, local_t = self.pack()
        if synced and world_size() > 1:
            dist.all_reduce(synced_t)
        if not synced and not local:
            return {}
        return self.unpack(synced, local, torch.cat([synced_t, local_t]).tolist())

    def hidden_names(self) -> set[str]:
        """Names (as reported) of the metrics logged without ``prog_bar``: not in progress."""
        names: set[str] = set()
        for m in self.metrics.values():
            if not m.prog_bar:
                both = self.stage == "train" and m.on_step and m.on_epoch
                names.update((f"{m.name}_step", f"{m.name}_epoch") if both else (m.name,))
        return names


def _sum(window: list[Any], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    tensors = [
        v.reshape(()).to(device, dtype)
        if isinstance(v, torch.Tensor)
        else torch.tensor(v, dtype=dtype, device=device)
        for v in window
    ]
    return torch.stack(tensors).sum()


def _cat(parts: list[torch.Tensor], log: MetricLog) -> torch.Tensor:
    if not parts:
        return torch.zeros(0, dtype=log.dtype, device=log.device)
    return torch.cat(parts).to(log.dtype)


def _what(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"a bool ({value})"
    return f"a {type(value).__name__}"


def _invalid(name: str, what: str, fix: str) -> MetricInvalid:
    return MetricInvalid(
        f"self.log({name!r}, ...) got {what}; a metric must be one number",
        hint=f"{fix}: self.log({name!r}, loss) with a one-element tensor (kept on the device, "
        "no .item()) or a Python float",
        details={"name": name, "value": what},
    )
