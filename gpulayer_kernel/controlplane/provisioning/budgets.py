"""Budgets (ADR 0011): spending limits per user or project, checked at submit, obeyed by the
autoscaler, and watched while jobs run.

A budget matches a job by its owner (``scope = user``: the user who submitted it, as the
control plane knows it, never a label anyone may write) or its ``project=...`` label. What it
has left, this
period (UTC day, week, month, or in total), is its limit less the *charges* of attempts that
ended in the period, less what is *committed*: the estimates of attempts placed or running now
and the quotes of jobs queued since submit. So a submit is refused when its estimate is more
than that (with the estimate, what is left, and how to raise it); the autoscaler launches
nothing a budget cannot pay for (it is handed ``left()``); and a running job whose cost so far
carries a budget past its limit is warned (``policy = warn``, the default: a log line on the
job, once) or cancelled, saying why (``policy = cancel``): never silently killed.

Charges are summed as the ledger writes them (``on_rows``) and read back from the store at
start and whenever a period rolls over.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import (
    Budget,
    BudgetPolicy,
    BudgetStatus,
    CostEntry,
    CostKind,
    Job,
    JobSpec,
    JobState,
)
from ...errors import BudgetExceeded, NotFound
from ...store import MetadataStore
from ...words import dollars
from ..jobs import JobTable
from ..logs import LogTails
from .ledger import PROJECT_LABEL

EPS = 1e-9


def period_start(budget: Budget, now: float) -> float | None:
    """When the budget's current period began (UTC); None for ``total``."""
    if budget.period == "total":
        return None
    t = time.gmtime(now)
    if budget.period == "day":
        return float(calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)))
    if budget.period == "week":
        midnight = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return float(midnight - t.tm_wday * 86400)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def matches(budget: Budget, labels: dict[str, str], owner: str) -> bool:
    """Whether a job (its labels, its owner) spends from ``budget``."""
    if budget.scope == "user":
        return owner == budget.match
    return labels.get(PROJECT_LABEL) == budget.match


def _entry_matches(budget: Budget, e: CostEntry) -> bool:
    return (e.user if budget.scope == "user" else e.project) == budget.match


class Budgets:
    """Owns the budgets and what each has spent this period."""

    def __init__(
        self,
        store: MetadataStore,
        jobs: JobTable,
        logs: LogTails,
        *,
        clock: Clock = SYSTEM_CLOCK,
        cancel: Callable[[Job, str], Awaitable[object]] | None = None,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.logs = logs
        self.clock = clock
        self.cancel = cancel
        self._budgets: dict[str, Budget] = {}
        self._spent: dict[str, tuple[float | None, float]] = {}  # name -> (period start, sum)
        self._quotes: dict[str, tuple[tuple[str, ...], float]] = {}  # queued job -> quote
        self._warned: set[tuple[str, str]] = set()  # (job, budget) already told

    async def load(self) -> None:
        self._budgets = {b.name: b for b in await self.store.load_budgets()}
        await self._recount(self._budgets.values())

    async def _recount(self, budgets: Iterable[Budget]) -> None:
        now = self.clock.now()
        todo = list(budgets)
        if not todo:
            return
        starts = [period_start(b, now) for b in todo]
        since = None if any(s is None for s in starts) else min(s for s in starts if s is not None)
        charges = [e for e in await self.store.list_costs(since) if e.kind == CostKind.CHARGE]
        for b, start in zip(todo, starts, strict=True):
            total = sum(
                e.amount
                for e in charges
                if _entry_matches(b, e) and (start is None or e.at >= start)
            )
            self._spent[b.name] = (start, total)

    # -- reading ---------------------------------------------------------------------------------

    def any(self) -> bool:
        return bool(self._budgets)

    def names_for(self, spec: JobSpec, owner: str) -> tuple[str, ...]:
        """The budgets a job of ``spec`` submitted by ``owner`` spends from."""
        if not self._budgets:
            return ()
        return tuple(sorted(n for n, b in self._budgets.items() if matches(b, spec.labels, owner)))

    def spent(self, name: str) -> float:
        return self._spent.get(name, (None, 0.0))[1]

    def committed(self, name: str, *, queued: bool = True) -> float:
        """Estimates of attempts placed or running now, and (``queued``) quotes of queued jobs."""
        b = self._budgets[name]
        total = 0.0
        for job in self.jobs.active():
            if not matches(b, job.spec.labels, job.owner):
                continue
            if job.state == JobState.QUEUED:
                if not queued:
                    continue
                names, quote = self._quotes.get(job.id, ((), 0.0))
                total += quote if name in names else 0.0
            elif job.history and job.history[-1].ended_at is None:
                total += job.history[-1].estimate
        return total

    def left(self, *, queued: bool = True) -> dict[str, float]:
        """Dollars each budget has left now. Without ``queued`` the queued jobs' quotes are not
        taken off: what the autoscaler, which plans for those very jobs, may spend on them."""
        return {
            n: self._budgets[n].limit - self.spent(n) - self.committed(n, queued=queued)
            for n in self._budgets
        }

    def status(self) -> list[BudgetStatus]:
        now = self.clock.now()
        out = []
        for name, b in sorted(self._budgets.items()):
            spent, committed = self.spent(name), self.committed(name)
            out.append(
                BudgetStatus(
                    budget=b,
                    spent=round(spent, 6),
                    committed=round(committed, 6),
                    # ``+ 0.0``: a sum that lands on -0.0 is sent as 0.0, not as ``-0.0``.
                    left=round(b.limit - spent - committed, 6) + 0.0,
                    period_start=period_start(b, now),
                )
            )
        return out

    # -- checks ----------------------------------------------------------------------------------

    def check(self, spec: JobSpec, owner: str, estimate: float, where: str = "") -> tuple[str, ...]:
        """Refuse a submit whose estimate is more than a budget it spends from has left.

        A job that costs nothing (an owned worker with no price) is never refused: a budget
        overshot by running jobs has less than nothing left, and a free job takes none of it."""
        names = self.names_for(spec, owner)
        if estimate <= EPS:
            return names
        left = self.left()
        for name in names:
            if estimate > left[name] + EPS:
                b = self._budgets[name]
                on = f" on {where}" if where else ""
                raise BudgetExceeded(
                    f"job {spec.name!r} would cost {_cost(estimate)}{on}, more than budget "
                    f"`{name}` ({b.scope} {b.match}) has left: {dollars(max(0.0, left[name]))} "
                    f"of {dollars(b.limit)} {_period_word(b)}",
                    hint=f"raise it with `gpulayer budgets set {name} --limit "
                    f"{_raise_to(b, estimate - left[name])}`, ask for less (a shorter --timeout, "
                    "fewer GPUs), or wait for the next period",
                    details={
                        "budget": name,
                        "estimate": round(estimate, 6),
                        "left": round(left[name], 6),
                        "limit": b.limit,
                    },
                )
        return names

    def quoted(self, job_id: str, names: tuple[str, ...], estimate: float) -> None:
        """Count a queued job's estimate as committed until it is placed."""
        if names:
            self._quotes[job_id] = (names, estimate)

    def job_changed(self, job: Job) -> None:
        if job.state != JobState.QUEUED:
            self._quotes.pop(job.id, None)
        if job.state.terminal:
            self._warned = {w for w in self._warned if w[0] != job.id}

    def on_rows(self, rows: Sequence[CostEntry]) -> None:
        """New ledger rows (the job table wrote them): charges count as spent."""
        if not self._budgets:
            return
        for e in rows:
            if e.kind != CostKind.CHARGE or not e.amount:
                continue
            for name, b in self._budgets.items():
                start, total = self._spent.get(name, (None, 0.0))
                if _entry_matches(b, e) and (start is None or e.at >= start):
                    self._spent[name] = (start, total + e.amount)

    async def watch(self) -> None:
        """Running jobs whose cost so far carries a budget past its limit: warn or cancel."""
        if not self._budgets:
            return
        now = self.clock.now()
        stale = [
            b
            for b in self._budgets.values()
            if self._spent.get(b.name, (None,))[0] != period_start(b, now)
        ]
        await self._recount(stale)  # a new day, week or month began
        running = [j for j in self.jobs.active() if j.state == JobState.RUNNING and j.history]
        for b in list(self._budgets.values()):
            mine = [(j, _so_far(j, now)) for j in running if matches(b, j.spec.labels, j.owner)]
            total = self.spent(b.name) + sum(c for _, c in mine)
            if total <= b.limit + EPS:
                continue
            for job, cost in mine:
                if (job.id, b.name) in self._warned:
                    continue
                self._warned.add((job.id, b.name))
                said = (
                    f"budget `{b.name}` is exceeded: {dollars(total)} of {dollars(b.limit)} "
                    f"{_period_word(b)}, {dollars(cost)} of it by this job so far"
                )
                if b.policy == BudgetPolicy.CANCEL and self.cancel is not None:
                    await self.cancel(job, f"cancelled: {said} (policy cancel)")
                else:
                    await self.logs.system(
                        job.id,
                        f"{said}; it goes on (policy warn): raise the limit with `gpulayer "
                        f"budgets set {b.name} --limit ...` or cancel it",
                    )

    # -- changing --------------------------------------------------------------------------------

    async def set(self, budget: Budget) -> BudgetStatus:
        await self.store.save_budget(budget)
        self._budgets[budget.name] = budget
        await self._recount([budget])
        return next(s for s in self.status() if s.budget.name == budget.name)

    async def delete(self, name: str) -> None:
        if name not in self._budgets:
            raise NotFound(
                f"no budget {name!r}",
                hint="list them with `gpulayer budgets`",
                details={"budget": name},
                code="budget_not_found",
            )
        await self.store.delete_budget(name)
        del self._budgets[name]
        self._spent.pop(name, None)


def _so_far(job: Job, now: float) -> float:
    r = job.history[-1]
    if r.ended_at is not None or r.started_at is None:
        return 0.0
    return r.units * r.unit_price * max(0.0, now - r.started_at) / 3600.0


def _cost(estimate: float) -> str:
    """An estimate as dollars; one under a cent says so, rather than ``≈ $0.00`` (which reads as
    free, and a free job is never refused)."""
    return f"≈ {dollars(estimate)}" if estimate >= 0.005 else "under $0.01"


def _period_word(b: Budget) -> str:
    return "in total" if b.period == "total" else f"this {b.period}"


def _raise_to(b: Budget, short: float) -> str:
    return f"{b.limit + max(short, 0.01):.2f}"
