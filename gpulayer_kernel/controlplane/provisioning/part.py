"""Provisioning and accounting, wired (ADR 0010, 0011): the ledger, budgets, instances and,
where this control plane serves workers, the autoscaler.

The control plane (built in ``wiring.py``) keeps one ``Provisioning`` and calls it at the few
points where jobs and workers meet money and machines: a submit (the budget check), a join (an
instance's worker), a job change (budgets' committed estimates), and the read calls the CLI, the
API and the panel use (providers, instances, costs, budgets). The ledger itself is wired into
the job table's commit path, so nothing here writes a cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import (
    Budget,
    BudgetList,
    BudgetStatus,
    CostReport,
    InstanceList,
    Job,
    JobSpec,
    ProviderCheck,
    ProviderList,
)
from ...contracts.costs import GroupBy
from ...errors import GPUlayerError, InvalidInput
from ...providers import Provider, ProvidersConfig
from ...security import TokenService
from ...store import MetadataStore
from ..jobs import JobTable
from ..logs import LogTails
from ..scheduling import SchedulingLoop
from ..workers import WorkerRegistry
from .autoscaler import Autoscaler, Lose
from .budgets import Budgets
from .costs import summarize
from .instances import InstanceTable
from .ledger import Ledger

GROUPS: tuple[GroupBy, ...] = ("job", "user", "project", "provider", "day")
TYPICAL_WINDOW = 30 * 86400.0  # charges read back at start to learn typical run times
CHECK_TIMEOUT = 20.0


class Provisioning:
    """Owns the ledger, budgets, instance table and (optionally) the autoscaler."""

    def __init__(
        self,
        store: MetadataStore,
        jobs: JobTable,
        registry: WorkerRegistry,
        tails: LogTails,
        scheduling: SchedulingLoop,
        *,
        lose: Lose,
        cancel: Callable[[Job, str], Awaitable[object]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.registry = registry
        self.scheduling = scheduling
        self.clock = clock
        self.lose = lose
        self.ledger = Ledger(clock=clock, worker=registry.get)
        jobs.ledger = self.ledger
        self.jobs = jobs
        self.budgets = Budgets(store, jobs, tails, clock=clock, cancel=cancel)
        self.ledger.on_rows = self.budgets.on_rows
        self.instances = InstanceTable(store)
        self.config: ProvidersConfig | None = None
        self.providers: dict[str, Provider] = {}
        self.autoscaler: Autoscaler | None = None

    async def start(self) -> None:
        await self.budgets.load()
        since = self.clock.now() - TYPICAL_WINDOW
        self.ledger.remember(await self.store.list_costs(since))

    async def close(self) -> None:
        if self.autoscaler is not None:
            await self.autoscaler.close()
            self.autoscaler = None
        else:
            for p in self.providers.values():
                with contextlib.suppress(Exception):
                    await p.close()

    def use(self, config: ProvidersConfig, providers: dict[str, Provider]) -> None:
        """The providers config (owned-hardware rates, the providers ``gpulayer providers``
        checks), with or without an autoscaler."""
        self.config = config
        self.providers = providers
        self.ledger.settings = config.costs

    async def autoscale(
        self, tokens: TokenService, server_url: str, *, rng: random.Random | None = None
    ) -> Autoscaler:
        """Run the autoscaler: workers it launches join ``server_url`` with instance tokens."""
        assert self.config is not None, "use(config, providers) first"
        a = Autoscaler(
            providers=self.providers,
            config=self.config,
            instances=self.instances,
            jobs=self.jobs,
            registry=self.registry,
            budgets=self.budgets,
            ledger=self.ledger,
            tokens=tokens,
            server_url=server_url,
            lose=self.lose,
            kick=self.scheduling.kick,
            clock=self.clock,
            rng=rng,
        )
        self.autoscaler = a
        self.ledger.instance_of = a.instance_of
        await a.start()
        self.scheduling.annotate = a.annotate
        self.scheduling.kick()
        return a

    # -- the facade's hooks ----------------------------------------------------------------------

    def check_submit(self, spec: JobSpec, owner: str) -> tuple[tuple[str, ...], float]:
        """The budgets a new job of ``owner`` spends from and its quote; refuses one it cannot
        afford."""
        if not self.budgets.names_for(spec, owner):
            return (), 0.0
        offers = self.autoscaler.offers() if self.autoscaler is not None else []
        workers = [w for w in self.registry.live() if w.schedulable]
        estimate, where = self.ledger.quote(spec, workers, offers)
        return self.budgets.check(spec, owner, estimate, where), estimate

    def submitted(self, job: Job, names: tuple[str, ...], estimate: float) -> None:
        self.budgets.quoted(job.id, names, estimate)

    def joining(self, token_id: str, worker_id: str, name: str) -> None:
        if self.autoscaler is not None:
            self.autoscaler.joining(token_id, worker_id, name)

    def job_changed(self, job: Job) -> None:
        self.budgets.job_changed(job)

    # -- reading and budgets ---------------------------------------------------------------------

    async def provider_list(self) -> ProviderList:
        """Every configured provider, checked now (reachable, its offers), with its state."""
        checks = await asyncio.gather(*(self._check(n, p) for n, p in self.providers.items()))
        return ProviderList(
            providers=list(checks),
            autoscaling=self.autoscaler is not None,
            config=self.config.path if self.config is not None else "",
        )

    async def _check(self, name: str, p: Provider) -> ProviderCheck:
        live = [i for i in self.instances.live() if i.provider == name]
        st = self.autoscaler.state.get(name) if self.autoscaler is not None else None
        base = {
            "name": name,
            "kind": p.kind,
            "instances": len(live),
            "max_instances": p.max_instances,
            "backoff_until": st.backoff_until if st else None,
            "last_error": st.last_error if st else None,
        }
        try:
            c = await asyncio.wait_for(p.check(), CHECK_TIMEOUT)
        except TimeoutError:
            return ProviderCheck(ok=False, detail=f"no answer within {CHECK_TIMEOUT:g}s", **base)
        except GPUlayerError as exc:
            return ProviderCheck(ok=False, detail=exc.message, **base)
        return ProviderCheck(ok=c.ok, detail=c.detail, offers=list(c.offers), **base)

    async def instance_list(self, ended: bool = False) -> InstanceList:
        listed = {i.id: i for i in await self.store.load_instances(ended=ended)}
        for i in self.instances.all().values():  # memory is newer (idle times)
            if ended or not i.state.ended:
                listed[i.id] = i
        return InstanceList(instances=sorted(listed.values(), key=lambda i: -i.requested_at))

    async def cost_report(
        self, by: GroupBy = "job", since: float | None = None, *, user: str | None = None
    ) -> CostReport:
        """The ledger summed by ``by`` (only ``user``'s jobs' rows when given)."""
        if by not in GROUPS:
            raise InvalidInput(
                f"cannot group costs by {by!r}",
                hint=f"group by one of: {', '.join(GROUPS)}",
                details={"parameter": "by", "by": by},
                code="bad_parameter",
            )
        entries = await self.store.list_costs(since)
        if user is not None:
            entries = [e for e in entries if e.user == user]
        instances = (await self.instance_list(ended=True)).instances if by == "provider" else []
        return summarize(entries, by, since=since, instances=instances)

    def budget_list(self) -> BudgetList:
        return BudgetList(budgets=self.budgets.status())

    async def set_budget(self, budget: Budget) -> BudgetStatus:
        status = await self.budgets.set(budget)
        self.scheduling.kick()  # what the autoscaler may spend changed
        return status

    async def delete_budget(self, name: str) -> None:
        await self.budgets.delete(name)
        self.scheduling.kick()
