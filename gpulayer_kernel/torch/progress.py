"""Training metrics without per-step syncs, and the one place that reports them.

Per step the Trainer only appends the detached loss tensor to a :class:`MetricWindow` (no
``.item()``: on a GPU that stalls the host until the device catches up, so the next step's
kernels are not queued in time). Every ``log_every`` steps the window is reduced with one sync
and, across ranks, one ``all_reduce``; the result goes to :class:`ProgressDisplay`, which sends
it to the job's widget (``gpulayer_kernel.job.progress``) inside a GPUlayer job and prints a
line otherwise.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

import torch
import torch.distributed as dist

from .. import job
from ..job.ranks import is_rank_zero, rank, world_size
from .errors import LossNotFinite

# Dense bf16/fp16 tensor-core peaks (FLOP/s), most specific name first: "L4" is in "L40S".
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
)


def peak_flops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` from :data:`PEAK_FLOPS`; None for CPUs and unknown GPUs."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS if key in name), None)


class MetricWindow:
    """The losses since the last log boundary, kept on the device until :meth:`reduce`."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.samples = 0
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor, samples: int) -> None:
        """Record one micro-batch: no sync, one list append (the detach drops the graph)."""
        self.losses.append(loss.detach())
        self.samples += samples

    def restart_clock(self) -> None:
        """Exclude the time since the last call (validation, checkpoints) from samples/s."""
        self.started = time.perf_counter()

    def reduce(
        self,
        first_step: int,
        accumulate: int,
        synced: torch.Tensor | None = None,
        local: torch.Tensor | None = None,
        stop: bool = False,
    ) -> tuple[float, float, list[float], bool]:
        """Mean loss, global samples/s, the ``self.log`` sums and whether any rank asked to stop.

        One host copy and, across ranks, one ``all_reduce`` for the loss, every metric logged
        with ``sync_dist`` (``synced``) and the ``stop`` flags (``max_time``, so all ranks stop
        at the same step); ``local`` metrics ride along in the same copy. Raises
        :class:`LossNotFinite` naming the first optimizer step (``first_step`` is the step of
        the window's first micro-batch) whose loss was NaN or infinite on any rank.
        """
        window = torch.stack(self.losses).float().flatten()  # autocast may give bf16 losses
        finite = torch.isfinite(window)
        n = window.numel()
        size = world_size()
        # float64 keeps logged values as logged (MPS has no float64: float32 there)
        dtype = torch.float32 if window.device.type == "mps" else torch.float64
        empty = window.new_zeros(0, dtype=dtype)
        synced = empty if synced is None else synced.to(window.device, dtype)
        local = empty if local is None else local.to(window.device, dtype)
        # The count of bad losses rides in the same all_reduce: only when some rank saw one
        # does the rare path find the first (one more sync and one more collective).
        stats = torch.cat(
            [
                torch.where(finite, window, 0.0).sum().reshape(1).to(dtype),
                window.new_tensor([float(self.samples), float(stop)], dtype=dtype),
                (~finite).sum().reshape(1).to(dtype),
                synced,
            ]
        )
        if size > 1:
            dist.all_reduce(stats)
        # The window's one host copy: everything reduced above, and the local metrics.
        host = torch.cat([stats, local]).tolist()
        loss_sum, samples, stops, bad = host[0], host[1], host[2], host[3]
        if bad:
            first_bad = int(torch.where(finite, n, torch.arange(n, device=window.device)).min())
            bad_step = first_step + first_bad // accumulate if first_bad < n else None
            self._raise_if_bad(bad_step, window, first_bad)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        count = n * size
        self.losses, self.samples, self.started = [], 0, time.perf_counter()
        return loss_sum / count, samples / elapsed, host[4:], stops > 0

    def _raise_if_bad(self, bad_step: int | None, window: torch.Tensor, index: int) -> None:
        sentinel = 2**62
        encoded = sentinel if bad_step is None else bad_step * world_size() + rank()
        if world_size() > 1:
            # Every rank must stop at the same step, named by the earliest bad one anywhere.
            agreed = torch.tensor([encoded], dtype=torch.int64, device=window.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            encoded = int(agreed)
        if encoded == sentinel:
            return
        step, bad_rank = divmod(encoded, world_size())
        value = float(window[index]) if bad_rank == rank() and bad_step == step else None
        raise LossNotFinite(step, bad_rank, value)


#: set in the ranks of a session and of a GPU kernel (worker/sessions/ranks.py)
SESSION_ENV = "GPULAYER_SESSION"


class ProgressDisplay:
    """Shows reduced metrics: the job's progress messages in a job, a text line elsewhere.

    Only rank zero shows anything. A one-shot job's widget draws its progress messages (lines
    would show twice); a session's or a GPU kernel's cell prints the lines as a local kernel
    does (its output is what the notebook shows while the cell runs) and reports the progress
    too, for the panel. On a terminal the line redraws in place (carriage return); in a
    notebook or a log it prints one line per report.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.enabled = is_rank_zero()
        self.in_job = job.in_job()
        self.lines = not self.in_job or bool(os.environ.get(SESSION_ENV))
        self.redraw = bool(getattr(self.stream, "isatty", lambda: False)())
        self.open_line = False

    def update(self, fields: dict[str, Any]) -> None:
        """Report ``fields`` (plain ints, floats or None; non-finite floats become None)."""
        if not self.enabled:
            return
        clean = {key: _json_number(value) for key, value in fields.items()}
        if self.in_job:
            job.progress(**clean)
        if not self.lines:
            return
        line = format_line(clean)
        if self.redraw:
            self.stream.write("\r" + line.ljust(100))
            self.open_line = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End a redrawn line so the next output starts on a fresh one."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def format_line(fields: dict[str, Any]) -> str:
    """One progress line, e.g. ``step 120/1000 epoch 1 loss 0.4123 2,345 samples/s mfu 41.2%``."""
    total = fields.get("total")
    parts = [f"step {fields['step']}" + (f"/{total}" if total else "")]
    parts.append(f"epoch {fields.get('epoch', 0)}")
    for key, value in fields.items():
        if key in {"step", "total", "epoch"} or value is None:
            continue
        if key == "samples_per_s":
            parts.append(f"{value:,.0f} samples/s")
        elif key == "mfu":
            parts.append(f"mfu {value:.1%}")
        elif key == "lr":
            parts.append(f"lr {value:.2e}")
        else:
            parts.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(parts)
