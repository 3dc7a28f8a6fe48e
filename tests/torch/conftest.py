"""Shared helpers of the Trainer tests: one process, a job's output dir, a metric-logging model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpulayer_kernel.torch.testing import TinyRegressor, regression_data  # noqa: E402


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No rank variables, no job; ``$GPULAYER_OUTPUT`` is ``tmp_path/output`` (returned)."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID", "GPULAYER_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "output"
    monkeypatch.setenv("GPULAYER_OUTPUT", str(out))
    monkeypatch.chdir(tmp_path)
    return out


def batches(n: int = 40, size: int = 4, seed: int = 0) -> list[Any]:
    """``n`` samples as a list of batches of ``size`` (a re-iterable loader)."""
    data = regression_data(n, seed=seed)
    return [data[i : i + size] for i in range(0, n, size)]


def tiny(**kwargs: Any) -> TinyRegressor:
    torch.manual_seed(0)  # the same initial weights for every model a test compares
    return TinyRegressor(**kwargs)
