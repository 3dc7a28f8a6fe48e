"""How a kernel shows jobs: ``widget`` (the anywidget) or ``text`` (``%gpulayer display``)."""

from __future__ import annotations

import os
import sys

from ..errors import MissingExtra

DISPLAY_ENV = "GPULAYER_DISPLAY"
DISPLAY_MODES = ("auto", "widget", "text")

_display_mode: str | None = None
_told_no_widgets = False


def set_display_mode(mode: str) -> None:
    """What ``%gpulayer display MODE`` asked for (one of ``DISPLAY_MODES``)."""
    global _display_mode
    _display_mode = mode


def display_mode() -> str:
    """``widget`` or ``text``: how this kernel shows jobs (``%gpulayer display`` sets it)."""
    mode = _display_mode or os.environ.get(DISPLAY_ENV, "auto").strip().lower() or "auto"
    if mode == "text":
        return "text"
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return "text"  # plain IPython in a terminal, or a script: nothing renders widgets
    try:
        import anywidget  # noqa: F401
    except ImportError as exc:
        if mode == "widget" or os.environ.get("JPY_SESSION_NAME"):
            _say_no_widgets(exc)  # a notebook wanted the widget: say why it gets text
        return "text"
    if mode == "widget":
        return "widget"
    # A kernel started by a Jupyter server for a notebook (JupyterLab, Notebook 7) has this;
    # nbval, nbconvert and jupyter_client scripts do not, and nothing renders widgets there.
    return "widget" if os.environ.get("JPY_SESSION_NAME") else "text"


def _say_no_widgets(exc: ImportError) -> None:
    """Once per kernel: jobs show as text because the jupyter extra (anywidget) is missing."""
    global _told_no_widgets
    if not _told_no_widgets:
        _told_no_widgets = True
        err = MissingExtra.of("jupyter", "the job widget", exc)
        print(f"gpulayer: showing jobs as text; {err.message}. {err.hint}", file=sys.stderr)
