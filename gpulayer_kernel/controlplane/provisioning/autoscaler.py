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
- Every ``reconcile_every`` seconds a round (``reconciler.py``) reads each provider's offers and
  machines (bounded by the same timeout) and applies ``reconcile``.

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

from ...autoscale import (
    InstanceView,
    PendingJob,
    ProviderView,
    ScalingPlan,
    ScalingSnapshot,
    plan_scaling,
)
from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import Instance, InstanceState, Offer, PlacementReport, WorkerState
from ...errors import GPUlayerError
from ...providers import LaunchSpec, Provider, ProvidersConfig
from ...scheduler import Plan, Snapshot
from ...scheduler.explain import with_scaling
from ...security import TokenKind, TokenService
from ..jobs import JobTable, new_id
from ..workers import WorkerRegistry
from .budgets import Budgets
from .instances import InstanceTable
from .ledger import Ledger
from .reconciler import Reconciler

T = TypeVar("T")
log = logging.getLogger("gpulayer.autoscaler")
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
        self.in_flight: set[str] = set()  # instances whose launch call runs now
        # Instances whose launch answered since the reconciler's listing began: that listing
        # may be older than their machine, so it cannot say they are gone (reconciler.round).
        self.answered: set[str] = set()
        self.ending: set[str] = set()  # instances whose termination runs now
        self.dirty: set[str] = set()  # instances changed in memory only (idle times)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.reconciler = Reconciler(self)

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.instances.load()
        await self.reconciler.refresh()
        self.reconciler.start()

    async def close(self) -> None:
        await self.reconciler.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.instances.save(self.dirty)
        for p in self.providers.values():
            with contextlib.suppress(Exception):
                await p.close()

    async def bounded(self, coro: Coroutine[Any, Any, T], what: str) -> T:
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

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("autoscaler task failed", exc_info=task.exception())

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
                    budgets=self.budgets.names_for(job.spec, job.owner),
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
                self.dirty.add(inst.id)
            elif not busy and inst.idle_since is None:
                self.instances.change(inst.id, idle_since=now)
                self.dirty.add(inst.id)

    def _execute(self, plan: ScalingPlan, now: float) -> None:
        for launch in plan.launches:
            self._launch(launch.offer, launch.jobs, now)
        for t in plan.terminations:
            inst = self.instances.get(t.instance_id)
            if inst is None or inst.id in self.ending or inst.state.ended:
                continue
            self.ending.add(inst.id)
            self.spawn(self._scale_down(inst.id, t.why))

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
        self.in_flight.add(iid)
        log.info("launching %s for job(s) %s as instance %s", offer.id, ", ".join(jobs), iid)
        self.spawn(self._do_launch(iid))
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
            # Where it will run, when the provider knows before launching (an SSH host): a
            # control plane killed mid-launch leaves a record that can still end the machine.
            self.instances.change(iid, token_id=rec.id, external_id=provider.where(inst.offer, iid))
            await self.instances.save([iid])
            how = LaunchSpec(
                instance_id=iid,
                worker_name=inst.worker_name,
                server_url=self.server_url,
                max_seconds=inst.offer.max_hours * 3600 if inst.offer.max_hours else None,
                ca_cert=self.settings.ca_cert,
            )
            external = await self.bounded(
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
            self.in_flight.discard(iid)
            self.answered.add(iid)
            self.kick()

    async def _failed(self, iid: str, why: str, *, boot: bool) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.state.ended:
            return
        log.warning("instance %s (%s) failed: %s", iid, inst.offer.id, why)
        self.instances.change(iid, S.FAILED, reason=why, ended_at=self.clock.now())
        if boot:
            self.count_failure(inst.provider, why)
        await self.revoke(inst)
        await self.instances.save([iid])

    def count_failure(self, provider: str, why: str) -> None:
        st = self.state[provider]
        st.failures += 1
        st.last_error = why
        top = min(self.settings.backoff_max, self.settings.backoff_base * 2 ** (st.failures - 1))
        delay = top / 2 + self.rng.uniform(0, top / 2)  # capped, with (equal) jitter
        st.backoff_until = self.clock.now() + delay
        self.clock.call_later(delay + 0.01, self.kick)  # plan again once it is over

    async def revoke(self, inst: Instance) -> None:
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
        self.spawn(self.instances.save([inst.id]))
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
                    iid,
                    S.JOINED if inst.state == S.DRAINING else None,
                    idle_since=None,
                    reason=None,
                )
                return
            if inst.state != S.DRAINING:
                # Why it drains rides on it: a reconciler round that sees it end before the
                # provider's terminate answers (its worker, told to stop, left) says that too.
                self.instances.change(iid, S.DRAINING, reason=why)
            await self.instances.save([iid])
            provider = self.providers[inst.provider]
            await self.bounded(
                provider.terminate(inst.id, inst.external_id), f"{inst.provider}'s terminate"
            )
            log.info("instance %s (%s) terminated: %s", iid, inst.offer.id, why)
            self.instances.change(iid, S.TERMINATED, reason=why, ended_at=self.clock.now())
            await self.revoke(inst)
            await self.instances.save([iid])
            # Its worker leaves on its own (SIGTERM); the next rounds forget it once it has.
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            msg = exc.message if isinstance(exc, GPUlayerError) else str(exc)
            log.warning("terminating instance %s failed (%s); the next round tries again", iid, msg)
        finally:
            self.ending.discard(iid)
            self.kick()
