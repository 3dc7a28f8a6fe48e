"""``Memo``: a map that forgets what the last pass did not use (the ``SchedulerCache``'s maps)."""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """A map that forgets what the last pass did not use (see ``cache.py``: generational).

    Values are never ``None``. Hot paths read ``new`` directly and call ``get`` only on a miss.
    """

    __slots__ = ("new", "old")

    def __init__(self) -> None:
        self.new: dict[K, V] = {}
        self.old: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        hit = self.new.get(key)
        if hit is None and self.old:
            hit = self.old.pop(key, None)
            if hit is not None:
                self.new[key] = hit
        return hit

    def put(self, key: K, value: V) -> V:
        self.new[key] = value
        return value

    def begin(self) -> None:
        """A pass starts: every entry is old until the pass uses it."""
        if self.old:  # the last pass did not end (it raised): keep both generations' entries
            self.old.update(self.new)
        else:
            self.old = self.new
        self.new = {}

    def keep(self) -> None:
        """Everything held is in use this pass (without asking for each entry)."""
        if self.old:
            self.new.update(self.old)
            self.old = {}

    def end(self) -> int:
        """A pass ended: drop what it did not use; returns how many entries went."""
        dropped = len(self.old)
        self.old = {}
        return dropped

    def __len__(self) -> int:
        return len(self.new) + len(self.old)
