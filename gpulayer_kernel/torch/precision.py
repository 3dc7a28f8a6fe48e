"""Precision and determinism for a fit: the autocast context, and deterministic kernels."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch


def autocast_for(precision: str, dev: torch.device) -> Callable[[], AbstractContextManager[Any]]:
    """A factory of the autocast context for ``precision`` on ``dev`` (nullcontext for 32)."""
    if precision == "32":
        return nullcontext  # entering a disabled autocast still costs a few microseconds
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    return functools.partial(torch.autocast, device_type=dev.type, dtype=dtype)


@contextlib.contextmanager
def determinism(on: bool) -> Iterator[None]:
    """Deterministic algorithms (and cuDNN) for the duration, as they were before afterwards."""
    if not on:
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it to comply
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]
