"""The ControlPlane (ADR 0001): a facade over its parts (see core.py), and the job state machine."""

from __future__ import annotations

from .core import ControlPlane
from .states import TRANSITIONS, check_transition

__all__ = ["TRANSITIONS", "ControlPlane", "check_transition"]
