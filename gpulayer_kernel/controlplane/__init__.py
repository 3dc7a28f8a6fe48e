"""The ControlPlane (ADR 0001): a facade over its parts (see core.py), and the job state machine.

Its names are imported on first use (``lazy.py``): a module of this package that is light on
its own (``audit``'s action names, which every ``gpulayer`` command's parser reads) does not pull
in the whole control plane (~200 ms) with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .core import ControlPlane
    from .states import TRANSITIONS, check_transition

__all__ = ["TRANSITIONS", "ControlPlane", "check_transition"]

__getattr__ = lazy_names(
    __name__,
    {"ControlPlane": "core", "TRANSITIONS": "states", "check_transition": "states"},
    globals(),
)
