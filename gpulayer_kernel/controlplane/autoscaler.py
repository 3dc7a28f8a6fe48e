"""The autoscaler part: runs the pure ``plan_scaling`` and ``reconcile``, and does what they say.

- After every scheduling pass (``annotate``, called by the scheduling loop with the pass's
  snapshot and plan) it builds a ``ScalingSnapshot``, plans, carries the plan out and returns
  the waiting jobs' reports with the autoscaler's note on each (worded by the one renderer).
- A launch is recorded (``InstanceTable.add``, in memory at once: the next decision counts it)
  and written to the store before its token is minted and the provider is called; the call is
  bounded by ``launch_timeout``. A failed or timed-out launch, or a boot that fails, counts
  against the provider: no launch there before a capped exponential backoff with jitter has
  passed (``backoff_until``, drawn here so the planner stays pure).
- A scale-down drains the worker first (no new work), checks it still runs nothing, then ends
  the machine; its worker leaves, and its record is removed.
- Every ``reconcile_every`` seconds a round reads each provider's offers and machines (bounded
  by the same timeout), applies ``reconcile`` (adopt, fail, preempt, end strays, boot
  deadlines), lets budgets watch running jobs, and runs a scheduling pass.

Every wait runs on the control plane's clock; a test drives it all with a FakeClock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..autoscale import (
    InstanceView,
    PendingJob,
    ProviderView,
    ScalingPlan,
    ScalingSnapshot,
    plan_scaling,
    reconcile,
)
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Instance, InstanceState, Offer, PlacementReport, WorkerState
from ..errors import GPUlayerError
from ..providers import Census, LaunchSpec, Provider, ProvidersConfig
from ..scheduler import Plan, Snapshot
from ..scheduler.explain import with_scaling
from ..security import TokenKind, TokenService
from .budgets import Budgets
from .instances import InstanceTable
from .jobs import JobTable, new_id
from .ledger import Ledger
from .workers import WorkerRegistry

T = TypeVar("T")
log = logging.getLogger("gpulayer.autoscaler")
LEAVE_GRACE = 60.0  # seconds the worker of an ended machine has to leave by itself
S = InstanceState
Lose = Callable[[str, str, bool], Awaitable[None]]


@dataclass
class ProviderState:
    """What the autoscaler knows of one provider between rounds."""

    offers: list[Offer] = field(default_factory=list)
    down: str | None = None
    failures: int = 0
    backoff_until: float | None = None
    last_error: str | None = None


class Autoscaler:
    """Owns the instance table and the providers' state; plans and reconciles on the clock."""

    def __init__(
        self,
        *,
        providers: Mapping[str, Provider],
        config: ProvidersConfig,
        instances: InstanceTable,
        jobs: JobTable,
        registry: WorkerRegistry,
        budgets: Budgets,
        ledger: Ledger,
        tokens: TokenService,
        server_url: str,
        lose: Lose,
        kick: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        self.providers = dict(providers)
        self.config = config
        self.settings = config.autoscale
        self.instances = instances
        self.jobs = jobs
        self.registry = registry
        self.budgets = budgets
        self.ledger = ledger
        self.tokens = tokens
        self.server_url = self.settings.server_url or server_url
        self.lose = lose
        self.kick = kick
        self.clock = clock
        self.rng = rng or random.Random()
        self.state = {name: ProviderState() for name in self.providers}
        self.last_plan = ScalingPlan()
        self._in_flight: set[str] = set()  # instances whose launch call runs now
        self._ending: set[str] = set()  # instances whose termination runs now
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._dirty: set[str] = set()  # instances changed in memory only (idle times)

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.instances.load()
        await self.refresh()
        self._loop = asyncio.get_running_loop().create_task(self._rounds())

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.instances.save(self._dirty)
        for p in self.providers.values():
            with contextlib.suppress(Exception):
                await p.close()

    async def _bounded(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """``coro`` within ``launch_timeout`` seconds of the control plane's clock."""
        task = asyncio.get_running_loop().create_task(coro)
        timeout = self.settings.launch_timeout
        try:
            if not await self.clock.wait_for(task, timeout):
                task.cancel()
                raise TimeoutError(f"{what} did not answer within {timeout:g}s")
        except asyncio.CancelledError:
            task.cancel()
            raise
        return task.result()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("autoscaler task failed", exc_info=task.exception())

    async def _rounds(self) -> None:
        while True:
            await self.clock.sleep(self.settings.reconcile_every)
            try:
                await self.round()
            except Exception:
                log.exception("autoscaler round failed")  # one bad round must not end them

    # -- the scheduling pass's hook --------------------------------------------------------------

    def annotate(self, snapshot: Snapshot, plan: Plan) -> dict[str, PlacementReport]:
        """Plan scaling for the pass's waiting jobs, carry it out, and word it on each."""
        now = self.clock.now()
        self._track_idle(now, {n.worker_id for a in plan.assignments for n in a.placement.nodes})
        pending = []
        for job_id in plan.pending:
            job = self.jobs.active_job(job_id)
            if job is None:
                continue
            pending.append(
                PendingJob(
                    id=job.id,
                    seq=job.seq,
                    priority=job.spec.priority,
                    resources=job.spec.resources,
                    submitted_at=job.submitted_at,
                    hours=self.ledger.hours(job),
                    budgets=self.budgets.names_for(job.spec),
                )
            )
        scaling = plan_scaling(
            self.snapshot(now, tuple(pending)), self.offers(), self.budgets.left(queued=False)
        )
        self.last_plan = scaling
        self._execute(scaling, now)
        return {
            job_id: with_scaling(report, scaling.notes.get(job_id))
            for job_id, report in plan.pending.items()
        }

    def snapshot(self, now: float, pending: tuple[PendingJob, ...] = ()) -> ScalingSnapshot:
        views = {
            name: ProviderView(
                name=name,
                max_instances=p.max_instances,
                backoff_until=self.state[name].backoff_until,
                failures=self.state[name].failures,
                last_error=self.state[name].last_error,
                down=self.state[name].down,
            )
            for name, p in self.providers.items()
        }
        instances = tuple(
            InstanceView(
                id=i.id,
                provider=i.provider,
                offer=i.offer,
                state=i.state,
                requested_at=i.requested_at,
                boot_deadline=i.boot_deadline,
                joined_at=i.joined_at,
                idle_since=i.idle_since,
            )
            for i in self.instances.live()
        )
        s = self.settings
        return ScalingSnapshot(
            now=now,
            pending=pending,
            providers=views,
            instances=instances,
            max_price_per_hour=s.max_price_per_hour,
            idle_timeout=s.idle_timeout,
            scale_up_after=s.scale_up_after,
        )

    def offers(self) -> list[Offer]:
        return [o for name in sorted(self.state) for o in self.state[name].offers]

    def _track_idle(self, now: float, assigned: set[str]) -> None:
        for inst in self.instances.live():
            if inst.state not in (S.JOINED, S.DRAINING) or inst.worker_id is None:
                continue
            w = self.registry.get(inst.worker_id)
            busy = inst.worker_id in assigned or bool(w is not None and w.running)
            if busy and inst.idle_since is not None:
                self.instances.change(inst.id, idle_since=None)
                self._dirty.add(inst.id)
            elif not busy and inst.idle_since is None:
                self.instances.change(inst.id, idle_since=now)
                self._dirty.add(inst.id)

    def _execute(self, plan: ScalingPlan, now: float) -> None:
        for launch in plan.launches:
            self._launch(launch.offer, launch.jobs, now)
        for t in plan.terminations:
            inst = self.instances.get(t.instance_id)
            if inst is None or inst.id in self._ending or inst.state.ended:
                continue
            self._ending.add(inst.id)
            self._spawn(self._scale_down(inst.id, t.why))

    # -- launching -------------------------------------------------------------------------------

    def _launch(self, offer: Offer, jobs: tuple[str, ...], now: float) -> Instance:
        iid = new_id()
        timeout = self._boot_timeout(offer.provider)
        inst = self.instances.add(
            Instance(
                id=iid,
                provider=offer.provider,
                offer=offer,
                worker_name=f"{offer.provider}-{iid[:8]}",
                requested_at=now,
                boot_deadline=now + timeout,
                for_jobs=list(jobs),
            )
        )
        self._in_flight.add(iid)
        log.info("launching %s for job(s) %s as instance %s", offer.id, ", ".join(jobs), iid)
        self._spawn(self._do_launch(iid))
        return inst

    def _boot_timeout(self, provider: str) -> float:
        s = self.config.providers.get(provider)
        return (s.boot_timeout if s is not None else None) or self.settings.boot_timeout

    async def _do_launch(self, iid: str) -> None:
        inst = self.instances.get(iid)
        assert inst is not None
        provider = self.providers[inst.provider]
        try:
            await self.instances.save([iid])  # recorded before the provider hears of it
            rec, secret = await self.tokens.create(
                TokenKind.INSTANCE,
                ttl=inst.boot_deadline - inst.requested_at + 60.0,
                name=f"instance {iid}",
            )
            self.instances.change(iid, token_id=rec.id)
            await self.instances.save([iid])
            how = LaunchSpec(
                instance_id=iid,
                worker_name=inst.worker_name,
                server_url=self.server_url,
                max_seconds=inst.offer.max_hours * 3600 if inst.offer.max_hours else None,
                ca_cert=self.settings.ca_cert,
            )
            external = await self._bounded(
                provider.launch(inst.offer, secret, how), f"{inst.provider}'s launch"
            )
            current = self.instances.get(iid)
            if current is None or current.state.ended:
                return  # ended meanwhile (the reconciler); its machine is a stray now
            state = S.BOOTING if current.state == S.REQUESTED else None
            self.instances.change(iid, state, external_id=external, launched_at=self.clock.now())
            await self.instances.save([iid])
        except asyncio.CancelledError:
            raise  # the control plane stops: the record stays requested, reconciled on restart
        except Exception as exc:
            why = exc.message if isinstance(exc, GPUlayerError) else str(exc) or type(exc).__name__
            await self._failed(iid, f"launch failed: {why}", boot=True)
        finally:
            self._in_flight.discard(iid)
            self.kick()

    async def _failed(self, iid: str, why: str, *, boot: bool) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.state.ended:
            return
        log.warning("instance %s (%s) failed: %s", iid, inst.offer.id, why)
        self.instances.change(iid, S.FAILED, reason=why, ended_at=self.clock.now())
        if boot:
            self._count_failure(inst.provider, why)
        await self._revoke(inst)
        await self.instances.save([iid])

    def _count_failure(self, provider: str, why: str) -> None:
        st = self.state[provider]
        st.failures += 1
        st.last_error = why
        top = min(self.settings.backoff_max, self.settings.backoff_base * 2 ** (st.failures - 1))
        delay = top / 2 + self.rng.uniform(0, top / 2)  # capped, with (equal) jitter
        st.backoff_until = self.clock.now() + delay
        self.clock.call_later(delay + 0.01, self.kick)  # plan again once it is over

    async def _revoke(self, inst: Instance) -> None:
        if inst.token_id is not None:
            with contextlib.suppress(GPUlayerError):
                await self.tokens.revoke(inst.token_id)

    # -- joining ---------------------------------------------------------------------------------

    def joining(self, token_id: str, worker_id: str, name: str) -> Instance | None:
        """A worker joins with an instance token: its instance is joined, before the worker is
        in the registry (so its first placement is priced as the instance's). None: the token
        was made by hand, not for an instance."""
        inst = self.instances.by_token(token_id)
        if inst is None or inst.state.ended:
            return None
        now = self.clock.now()
        state = S.JOINED if inst.state in (S.REQUESTED, S.BOOTING) else None
        inst = self.instances.change(
            inst.id, state, worker_id=worker_id, joined_at=now, idle_since=now
        )
        st = self.state.get(inst.provider)
        if st is not None:
            st.failures, st.backoff_until = 0, None
        log.info("instance %s (%s) joined as worker %s", inst.id, inst.offer.id, name)
        self._spawn(self.instances.save([inst.id]))
        return inst

    def instance_of(self, worker_id: str) -> Instance | None:
        return self.instances.by_worker(worker_id)

    # -- scaling down ----------------------------------------------------------------------------

    async def _scale_down(self, iid: str, why: str) -> None:
        try:
            inst = self.instances.get(iid)
            if inst is None or inst.state.ended:
                return
            wid = inst.worker_id
            w = self.registry.get(wid) if wid else None
            if w is not None and w.live and w.state != WorkerState.DRAINING:
                await self.registry.set_state(w.id, WorkerState.DRAINING)  # no new work
                w = self.registry.get(w.id)
            if w is not None and w.running:
                # A job landed on it after the decision: it stays.
                await self.registry.set_state(w.id, WorkerState.READY)
                self.instances.change(
                    iid, S.JOINED if inst.state == S.DRAINING else None, idle_since=None
                )
                return
            if inst.state != S.DRAINING:
                self.instances.change(iid, S.DRAINING)
            await self.instances.save([iid])
            provider = self.providers[inst.provider]
            await self._bounded(
                provider.terminate(inst.id, inst.external_id), f"{inst.provider}'s terminate"
            )
            log.info("instance %s (%s) terminated: %s", iid, inst.offer.id, why)
            self.instances.change(iid, S.TERMINATED, reason=why, ended_at=self.clock.now())
            await self._revoke(inst)
            await self.instances.save([iid])
            # Its worker leaves on its own (SIGTERM); the next rounds forget it once it has.
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            msg = exc.message if isinstance(exc, GPUlayerError) else str(exc)
            log.warning("terminating instance %s failed (%s); the next round tries again", iid, msg)
        finally:
            self._ending.discard(iid)
            self.kick()

    async def _forget_worker(self, worker_id: str, *, now: bool = False) -> None:
        """The worker of an ended machine: once it left (or at once with ``now``: its machine
        is gone), out of service, its sessions revoked (it cannot come back as itself), and
        forgotten."""
        w = self.registry.get(worker_id)
        if w is None:
            return
        if w.live and not now:
            return
        if w.live:
            await self.lose(worker_id, "its instance ended", False)
        await self.tokens.revoke_where(
            lambda r: r.kind == TokenKind.WORKER and r.worker_id == worker_id
        )
        with contextlib.suppress(GPUlayerError):
            await self.registry.remove(worker_id)

    async def _forget_ended_workers(self, now: float) -> None:
        """Workers of ended instances: forgotten once they left; after ``LEAVE_GRACE`` seconds
        still in service (a machine that ignored its end), taken out of service too."""
        for inst in self.instances.all().values():
            if not inst.state.ended or inst.worker_id is None:
                continue
            if self.registry.get(inst.worker_id) is None:
                continue
            late = inst.ended_at is not None and now - inst.ended_at > LEAVE_GRACE
            await self._forget_worker(inst.worker_id, now=late)

    # -- the reconciler --------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read every provider's offers (a provider that fails is ``down``; its offers stay)."""
        for name, p in self.providers.items():
            st = self.state[name]
            try:
                st.offers = list(await self._bounded(p.offers(), f"{name}'s offers"))
                st.down = None
            except Exception as exc:
                st.down = exc.message if isinstance(exc, GPUlayerError) else str(exc) or "timed out"

    async def round(self) -> None:
        """One reconciler round (the loop runs one every ``reconcile_every`` seconds)."""
        await self.refresh()
        census: dict[str, Census | None] = {}
        for name, p in self.providers.items():
            try:
                census[name] = await self._bounded(p.instances(), f"{name}'s instances")
            except Exception as exc:
                census[name] = None
                log.warning("listing %s's machines failed: %s", name, exc)
        now = self.clock.now()
        live = {w.id: w.live for w in self.registry.all()}
        r = reconcile(
            self.instances.all(),
            census,
            now=now,
            in_flight=frozenset(self._in_flight),
            workers_live=live,
        )
        changed = set(self._dirty)
        self._dirty.clear()
        for ch in r.changes:
            inst = self.instances.get(ch.instance_id)
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
                log.warning("instance %s (%s): %s", inst.id, inst.offer.id, ch.reason)
                await self._revoke(inst)
            self.instances.change(inst.id, ch.state, **fields)
            if ch.boot_failure:
                self._count_failure(inst.provider, ch.reason or "boot failed")
            changed.add(inst.id)
        for iid, charge in r.charges.items():
            inst = self.instances.get(iid)
            if inst is not None and inst.charge_reported != round(charge, 6):
                self.instances.change(iid, charge_reported=round(charge, 6))
                changed.add(iid)
        await self.instances.save(changed)
        for lost in r.lose:
            w = self.registry.get(lost.worker_id)
            if w is not None and w.live:
                await self.lose(lost.worker_id, lost.why, lost.preempted)
            await self._forget_worker(lost.worker_id)
        await self._forget_ended_workers(now)
        for iid in r.terminate:
            inst = self.instances.get(iid)
            if inst is not None and iid not in self._ending:
                self._spawn(self._end_at_provider(inst.provider, inst.id, inst.external_id))
        for stray in r.strays:
            log.warning(
                "%s runs %s, unknown to this control plane: ending it",
                stray.provider,
                stray.external_id,
            )
            self._spawn(
                self._end_at_provider(stray.provider, stray.instance_id or "", stray.external_id)
            )
        self.instances.forget_ended()
        await self.budgets.watch()
        self.kick()

    async def _end_at_provider(self, provider: str, iid: str, external_id: str | None) -> None:
        try:
            await self._bounded(
                self.providers[provider].terminate(iid, external_id), f"{provider}'s terminate"
            )
        except Exception as exc:
            log.warning(
                "ending %s at %s failed (%s); the next round tries again",
                external_id,
                provider,
                exc,
            )
