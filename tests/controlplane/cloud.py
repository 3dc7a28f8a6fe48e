"""A control plane with a FakeProvider of in-process machines, all on one FakeClock.

    async with cloud(tmp_path, offers=[...], **fake_settings) as c:
        job = await c.cp.submit(spec)
        await c.run_until(lambda: ..., most=60)

The control plane, its store (SQLite), tokens, ledger, budgets and autoscaler are the real ones;
only the machines are in-process (``gpulayer_kernel.testing.machines``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.providers import FakeProvider, parse_config
from gpulayer_kernel.security import TokenService
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, until
from gpulayer_kernel.testing.machines import InProcessMachines

A100X2 = {"name": "a100x2", "gpus": 2, "gpu_kind": "a100", "price_per_hour": 4.2}
CPU = {"name": "cpu", "gpus": 0, "price_per_hour": 0.1}


@dataclass
class Cloud:
    cp: ControlPlane
    clock: FakeClock
    tokens: TokenService
    provider: FakeProvider
    machines: InProcessMachines

    async def run_until(
        self, check: Callable[[], Any], most: float = 120, step: float = 0.5
    ) -> None:
        """Advance the clock ``step`` at a time until ``check()`` holds (at most ``most``)."""
        moved = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await until(check, timeout=0.02)
                return
            if moved >= most:
                raise AssertionError(f"not within {most}s of fake time")
            await self.clock.advance(step)
            moved += step


@contextlib.asynccontextmanager
async def cloud(
    tmp: Path,
    *,
    offers: list[dict[str, Any]] | None = None,
    autoscale: dict[str, Any] | None = None,
    costs: dict[str, Any] | None = None,
    seed: int = 0,
    path: Path | None = None,
    home: Path | None = None,
    start_machine: Any = None,
    **fake: Any,
) -> AsyncIterator[Cloud]:
    clock = FakeClock()
    store = SqliteStore(path or tmp / "cp.db")
    await store.open()
    cp = ControlPlane(store, LocalArtifactStore(tmp / "blobs"), clock=clock, heartbeat_timeout=10)
    cp.outcomes.rng = random.Random(seed)
    await cp.start()
    tokens = await TokenService(store).load()
    settings: dict[str, Any] = {
        "kind": "fake",
        "offers": offers or [A100X2],
        "boot_seconds": 5,
        "max_instances": 4,
        **fake,
    }
    config = parse_config(
        {
            "autoscale": {
                "idle_timeout": 30,
                "reconcile_every": 1,
                "backoff_base": 2,
                "launch_timeout": 5,
                "boot_timeout": 30,
                **(autoscale or {}),
            },
            "costs": costs or {},
            "providers": {"fake": settings},
        }
    )
    machines = InProcessMachines(cp, tokens, heartbeat=1.0)
    fp = config.providers["fake"]
    assert fp.kind == "fake"
    provider = FakeProvider(
        fp,
        clock=clock,
        home=home,
        start_machine=start_machine or machines.start,
        rng=random.Random(seed),
    )
    cp.provisioning.use(config, {"fake": provider})
    await cp.provisioning.autoscale(tokens, "http://127.0.0.1:1", rng=random.Random(seed))
    try:
        yield Cloud(cp, clock, tokens, provider, machines)
    finally:
        await machines.stop_all()
        await cp.close()
        await store.close()


class Silent:
    """A machine that boots but whose worker never joins (a wrong server URL, a firewall)."""

    def alive(self) -> bool:
        return True

    async def stop(self, *, kill: bool) -> None:
        return None


async def silent_machine(*_args: Any) -> Silent:
    return Silent()
