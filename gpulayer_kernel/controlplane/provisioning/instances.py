"""The instance table: every machine GPUlayer asked a provider for, and the one path it changes by.

Instances live in memory and are written through to the store. ``add`` records a launch in
memory at once (so the very next scaling decision counts it) and ``save`` writes it before the
provider is called: a control plane killed mid-launch finds its record on restart and adopts
the machine (or learns it was never launched) instead of launching again. Every later change is
checked against the transition table:

```
requested ──► booting ──► joined ──► draining ──► terminated
    │            │           │           │
    └────────────┴───────────┴───────────┴──► failed | preempted | terminated
```
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...contracts import Instance, InstanceState
from ...errors import Conflict
from ...store import MetadataStore

S = InstanceState
_ENDS = frozenset({S.TERMINATED, S.FAILED, S.PREEMPTED})
TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    S.REQUESTED: frozenset({S.BOOTING, S.JOINED, S.DRAINING}) | _ENDS,
    S.BOOTING: frozenset({S.JOINED, S.DRAINING}) | _ENDS,
    S.JOINED: frozenset({S.DRAINING}) | _ENDS,
    S.DRAINING: frozenset({S.JOINED}) | _ENDS,  # back to joined: a job landed on it meanwhile
    S.TERMINATED: frozenset(),
    S.FAILED: frozenset(),
    S.PREEMPTED: frozenset(),
}


class InstanceTable:
    """Owns instance records: in memory, written through; changes checked by ``TRANSITIONS``."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self._all: dict[str, Instance] = {}

    async def load(self) -> None:
        for inst in await self.store.load_instances():
            self._all[inst.id] = inst

    def get(self, instance_id: str) -> Instance | None:
        return self._all.get(instance_id)

    def all(self) -> dict[str, Instance]:
        return dict(self._all)

    def live(self) -> list[Instance]:
        return [i for i in self._all.values() if not i.state.ended]

    def by_token(self, token_id: str) -> Instance | None:
        return next((i for i in self._all.values() if i.token_id == token_id), None)

    def by_worker(self, worker_id: str) -> Instance | None:
        return next(
            (i for i in self._all.values() if i.worker_id == worker_id and not i.state.ended),
            None,
        ) or next((i for i in self._all.values() if i.worker_id == worker_id), None)

    def add(self, inst: Instance) -> Instance:
        """Record a new instance in memory (``save`` writes it)."""
        if inst.id in self._all:
            raise Conflict(f"instance {inst.id} exists already", code="instance_exists")
        self._all[inst.id] = inst
        return inst

    def change(
        self, instance_id: str, state: InstanceState | None = None, **fields: Any
    ) -> Instance:
        """Apply one change in memory, checked against the table (``save`` writes it)."""
        inst = self._all[instance_id]
        if state is not None and state != inst.state:
            if state not in TRANSITIONS[inst.state]:
                raise Conflict(
                    f"instance {instance_id} cannot go from {inst.state.value} to {state.value}",
                    hint="an ended instance changes no more",
                    details={"instance": instance_id, "from": inst.state.value, "to": state.value},
                    code="illegal_transition",
                )
            fields["state"] = state
        inst = self._all[instance_id] = inst.model_copy(update=fields)
        return inst

    async def save(self, instance_ids: Iterable[str]) -> None:
        rows = [self._all[i] for i in dict.fromkeys(instance_ids) if i in self._all]
        if rows:
            await self.store.save_instances(rows)

    def forget_ended(self, keep: int = 200) -> None:
        """Keep only the newest ``keep`` ended records in memory (the store keeps them all)."""
        ended = sorted(
            (i for i in self._all.values() if i.state.ended), key=lambda i: i.requested_at
        )
        for inst in ended[: max(0, len(ended) - keep)]:
            del self._all[inst.id]
