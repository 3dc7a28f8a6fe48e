"""The reconciler: each round, what the providers say they run, against what GPUlayer recorded.

Every ``reconcile_every`` seconds (on the control plane's clock) it reads each provider's offers
and machines (each call bounded by ``launch_timeout``), applies the pure ``autoscale.reconcile``
(adopt a recorded launch, fail one never made, preempt, fail one ended elsewhere or past its boot
deadline, end strays and machines whose worker is gone), forgets the workers of ended machines
once they left, lets budgets watch running jobs (the reaper does too), and runs a scheduling pass
(so the autoscaler plans on what it learnt). It shares the autoscaler's instance table, provider
state and bounded calls; it decides nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from ...autoscale import reconcile
from ...clock import Clock
from ...contracts import Instance, InstanceState
from ...errors import GPUlayerError
from ...providers import Census, Provider
from ...providers.config import AutoscaleSettings
from ...security import TokenKind, TokenService
from ..workers import WorkerRegistry
from .budgets import Budgets
from .instances import InstanceTable

T = TypeVar("T")


class Scaler(Protocol):
    """What a round uses of its autoscaler (``autoscaler.Autoscaler``)."""

    registry: WorkerRegistry
    tokens: TokenService
    instances: InstanceTable
    providers: dict[str, Provider]

    @property
    def state(self) -> Mapping[str, Any]: ...

    clock: Clock
    settings: AutoscaleSettings
    in_flight: set[str]
    answered: set[str]
    ending: set[str]
    dirty: set[str]
    budgets: Budgets
    lose: Callable[[str, str, bool], Awaitable[None]]
    kick: Callable[[], None]

    async def bounded(self, coro: Coroutine[Any, Any, T], what: str) -> T: ...

    async def revoke(self, inst: Instance) -> None: ...

    def count_failure(self, provider: str, why: str) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


S = InstanceState
log = logging.getLogger("gpulayer.autoscaler")
LEAVE_GRACE = 60.0  # seconds the worker of an ended machine has to leave by itself


class Reconciler:
    """Runs the rounds of one autoscaler (``start`` / ``stop``)."""

    def __init__(self, autoscaler: Scaler) -> None:
        self.a = autoscaler
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop().create_task(self._rounds())

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    async def _rounds(self) -> None:
        while True:
            await self.a.clock.sleep(self.a.settings.reconcile_every)
            try:
                await self.round()
            except Exception:
                log.exception("autoscaler round failed")  # one bad round must not end them

    async def forget_worker(self, worker_id: str, *, now: bool = False) -> None:
        """The worker of an ended machine: once it left (or at once with ``now``: its machine
        is gone), out of service, its sessions revoked (it cannot come back as itself), and
        forgotten."""
        w = self.a.registry.get(worker_id)
        if w is None:
            return
        if w.live and not now:
            return
        if w.live:
            await self.a.lose(worker_id, "its instance ended", False)
        await self.a.tokens.revoke_where(
            lambda r: r.kind == TokenKind.WORKER and r.worker_id == worker_id
        )
        with contextlib.suppress(GPUlayerError):
            await self.a.registry.remove(worker_id)

    async def _forget_ended(self, now: float) -> None:
        """Workers of ended instances: forgotten once they left; after ``LEAVE_GRACE`` seconds
        still in service (a machine that ignored its end), taken out of service too."""
        for inst in self.a.instances.all().values():
            if not inst.state.ended or inst.worker_id is None:
                continue
            if self.a.registry.get(inst.worker_id) is None:
                continue
            late = inst.ended_at is not None and now - inst.ended_at > LEAVE_GRACE
            await self.forget_worker(inst.worker_id, now=late)

    # -- the reconciler --------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read every provider's offers (a provider that fails is ``down``; its offers stay)."""
        for name, p in self.a.providers.items():
            st = self.a.state[name]
            try:
                st.offers = list(await self.a.bounded(p.offers(), f"{name}'s offers"))
                st.down = None
            except Exception as exc:
                st.down = exc.message if isinstance(exc, GPUlayerError) else str(exc) or "timed out"

    async def round(self) -> None:
        """One reconciler round (the loop runs one every ``reconcile_every`` seconds)."""
        await self.refresh()
        self.a.answered.clear()
        census: dict[str, Census | None] = {}
        for name, p in self.a.providers.items():
            try:
                census[name] = await self.a.bounded(p.instances(), f"{name}'s instances")
            except Exception as exc:
                census[name] = None
                log.warning("listing %s's machines failed: %s", name, exc)
        now = self.a.clock.now()
        live = {w.id: w.live for w in self.a.registry.all()}
        r = reconcile(
            self.a.instances.all(),
            census,
            now=now,
            # A launch that answered while the machines were listed counts as in flight: the
            # listing may predate its machine.
            in_flight=frozenset(self.a.in_flight | self.a.answered),
            workers_live=live,
        )
        changed = set(self.a.dirty)
        self.a.dirty.clear()
        for ch in r.changes:
            inst = self.a.instances.get(ch.instance_id)
            if inst is None or inst.state.ended:
                continue
            fields: dict[str, Any] = {}
            if ch.external_id is not None:
                fields["external_id"] = ch.external_id
                fields["launched_at"] = inst.launched_at or now
            if ch.reason is not None:
                fields["reason"] = ch.reason
            if ch.state is not None and ch.state.ended:
                fields["ended_at"] = now
                # A drained machine's end is the plan's doing (its reason: "idle for 30s"): no
                # warning. Its worker, told to stop, may leave before terminate answers.
                level = logging.INFO if ch.state == S.TERMINATED else logging.WARNING
                log.log(level, "instance %s (%s): %s", inst.id, inst.offer.id, ch.reason)
                await self.a.revoke(inst)
            self.a.instances.change(inst.id, ch.state, **fields)
            if ch.boot_failure:
                self.a.count_failure(inst.provider, ch.reason or "boot failed")
            changed.add(inst.id)
        for iid, charge in r.charges.items():
            inst = self.a.instances.get(iid)
            if inst is not None and inst.charge_reported != round(charge, 6):
                self.a.instances.change(iid, charge_reported=round(charge, 6))
                changed.add(iid)
        await self.a.instances.save(changed)
        for lost in r.lose:
            w = self.a.registry.get(lost.worker_id)
            if w is not None and w.live:
                await self.a.lose(lost.worker_id, lost.why, lost.preempted)
            await self.forget_worker(lost.worker_id)
        await self._forget_ended(now)
        for iid in r.terminate:
            inst = self.a.instances.get(iid)
            if inst is not None and iid not in self.a.ending:
                self.a.spawn(self.end_at_provider(inst.provider, inst.id, inst.external_id))
        for stray in r.strays:
            log.warning(
                "%s runs %s, unknown to this control plane: ending it",
                stray.provider,
                stray.external_id,
            )
            self.a.spawn(
                self.end_at_provider(stray.provider, stray.instance_id or "", stray.external_id)
            )
        self.a.instances.forget_ended()
        await self.a.budgets.watch()
        self.a.kick()

    async def end_at_provider(self, provider: str, iid: str, external_id: str | None) -> None:
        try:
            await self.a.bounded(
                self.a.providers[provider].terminate(iid, external_id), f"{provider}'s terminate"
            )
        except Exception as exc:
            log.warning(
                "ending %s at %s failed (%s); the next round tries again",
                external_id,
                provider,
                exc,
            )
