"""The public namespaces: sorted, importable, nothing missing."""

from __future__ import annotations

import gpulayer_kernel.capabilities as capabilities
import gpulayer_kernel.scheduler as scheduler


def test_scheduler_exports() -> None:
    assert scheduler.__all__ == sorted(scheduler.__all__)
    assert all(hasattr(scheduler, name) for name in scheduler.__all__)
    assert {"schedule", "Snapshot", "Plan", "WorkerView", "JobRequest", "render"} <= set(
        scheduler.__all__
    )


def test_capabilities_exports() -> None:
    assert capabilities.__all__ == sorted(capabilities.__all__)
    assert all(hasattr(capabilities, name) for name in capabilities.__all__)
    assert {"run_probe", "simulated_capabilities", "worker_support"} <= set(capabilities.__all__)
    assert {"local_capabilities", "LocalProbe"} <= set(capabilities.__all__)
