"""``FitResult.plot()``: the history as a matplotlib figure (matplotlib is optional)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import DependencyMissing

#: progress bookkeeping, not curves worth drawing by default
SKIP = frozenset({"step", "epoch", "total", "samples_per_s", "mfu", "lr"})


def plot_history(
    history: Sequence[dict[str, Any]], metrics: Sequence[str] | None = None, ax: Any = None
) -> Any:
    """Lines of ``metrics`` (default: every numeric one but bookkeeping) against the step.

    Loss-like metrics (``loss`` in the name) share the left axis, the others a right one, so an
    accuracy in [0, 1] stays readable next to a loss of 2.3. Returns the Figure.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise DependencyMissing(
            "FitResult.plot() needs matplotlib, which is not installed",
            hint="pip install matplotlib (or read FitResult.history, a list of dicts)",
            details={"package": "matplotlib"},
        ) from None
    names = list(metrics) if metrics is not None else _numeric_names(history)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.5))
    else:
        fig = ax.figure
    losses = [n for n in names if "loss" in n]
    others = [n for n in names if "loss" not in n]
    right = ax.twinx() if losses and others else None
    for axis, group in ((ax, losses or others), (right, others if losses else [])):
        if axis is None:
            continue
        for name in group:
            points = [(h["step"], h[name]) for h in history if h.get(name) is not None]
            if points:
                steps, values = zip(*points, strict=True)
                axis.plot(steps, values, label=name, marker="." if len(points) < 30 else None)
        axis.set_ylabel(", ".join(group))
    ax.set_xlabel("step")
    handles = [h for a in (ax, right) if a is not None for h in a.get_legend_handles_labels()[0]]
    if handles:
        ax.legend(handles=handles, loc="best")
    ax.grid(True, alpha=0.3)
    return fig


def _numeric_names(history: Sequence[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for entry in history:
        for key, value in entry.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if key not in SKIP and key not in names and number:
                names.append(key)
    return names
