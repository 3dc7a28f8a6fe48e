"""How long to wait before trying again: the one retry rule of the worker's transports and agent."""

from __future__ import annotations

import random


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Capped exponential backoff with full jitter (attempt 0 waits up to ``base`` seconds)."""
    return random.uniform(0, min(cap, base * 2**attempt))
