"""The cost ledger (ADR 0011): an estimate when an attempt is placed, a charge when it ends.

It is called by the job table's one commit path (``JobTable.stage``), never by an edge: every
placement, start and end of an attempt, whoever reported it, passes here. ``account`` keeps the
job's ``history`` (one ``AttemptRecord`` per attempt, in the job's own body: written with the
job in one store write) and returns the ledger rows (``CostEntry``) the job table writes beside
the job, in the same group commit.

- *estimate*, at placement: the attempt's price per unit-hour x its units (GPUs held; the whole
  machine on a worker without GPUs) x its hours: the timeout, else the median run time of the
  last jobs of that name, else ``costs.typical_hours``;
- *charge*, at its end: the same price x the unit-seconds it actually held (from its start; an
  attempt that never started is charged nothing).

A price comes from the worker's instance (its offer's price per GPU-hour) or, for hand-started
workers, the configured owned rate (``[costs]``, by worker-name glob). Rows are keyed by (job,
attempt, kind), and an attempt is closed once: a report delivered twice, a restart that replays
a change, can never charge twice.
"""

from __future__ import annotations

import fnmatch
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...autoscale.fit import Fits, offer_capabilities
from ...clock import SYSTEM_CLOCK, Clock
from ...contracts import (
    AttemptRecord,
    CostEntry,
    CostKind,
    Instance,
    Job,
    JobSpec,
    JobState,
    Offer,
    WorkerInfo,
)
from ...contracts._base import built
from ...contracts.costs import Outcome
from ...providers.config import CostSettings

TYPICAL_RUNS = 20  # ended attempts of one job name kept for its typical run time
USER_LABEL = "user"
PROJECT_LABEL = "project"


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How an attempt ended, when its job's new state alone does not say (a retry, a requeue,
    a preemption): given to ``JobTable.stage`` by the outcome that decided it."""

    outcome: Outcome
    reason: str | None = None
    exit_code: int | None = None
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class Price:
    units: float
    unit_price: float  # dollars per unit-hour
    provider: str | None
    instances: tuple[str, ...]


class Ledger:
    """Prices attempts and keeps each job's attempt history; owns no store of its own."""

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        settings: CostSettings | None = None,
        worker: Callable[[str], WorkerInfo | None] = lambda _w: None,
        instance_of: Callable[[str], Instance | None] = lambda _w: None,
    ) -> None:
        self.clock = clock
        self.settings = settings or CostSettings()
        self.worker = worker  # worker id -> its record (names, devices)
        self.instance_of = instance_of  # worker id -> the instance it runs on, if launched
        self._runs: dict[str, deque[float]] = {}  # job name -> recent run hours
        self.on_rows: Callable[[Sequence[CostEntry]], None] = lambda _rows: None

    # -- prices ----------------------------------------------------------------------------------

    def owned_rate(self, name: str, gpus: bool) -> float:
        """Dollars per unit-hour of a hand-started worker called ``name``."""
        for pattern, rate in self.settings.workers.items():
            if fnmatch.fnmatchcase(name, pattern):
                return rate
        return self.settings.gpu_hour if gpus else self.settings.machine_hour

    def price(self, job: Job) -> Price:
        """What the job's placement costs per hour, and what it holds."""
        assert job.placement is not None
        units = cost = 0.0
        providers: set[str] = set()
        instances: list[str] = []
        for node in job.placement.nodes:
            w = self.worker(node.worker_id)
            has_gpus = bool(w and w.capabilities.devices)
            # GPUs held (none for a CPU job on a GPU worker), or the whole GPU-less machine.
            held = float(len(node.devices)) if has_gpus else 1.0
            inst = self.instance_of(node.worker_id)
            if inst is not None:
                rate = inst.offer.unit_price
                providers.add(inst.provider)
                instances.append(inst.id)
            else:
                rate = self.owned_rate(node.worker_name, has_gpus)
            units += held
            cost += held * rate
        provider = next(iter(providers)) if len(providers) == 1 else None
        return Price(units, cost / units if units else 0.0, provider, tuple(instances))

    def hours(self, job: Job | JobSpec) -> float:
        """What the estimate assumes: the timeout, else the typical run of jobs of its name."""
        spec = job.spec if isinstance(job, Job) else job
        if spec.timeout:
            return spec.timeout / 3600.0
        runs = self._runs.get(spec.name)
        if runs:
            return statistics.median(runs)
        return self.settings.typical_hours

    def quote(
        self, spec: JobSpec, workers: Sequence[WorkerInfo], offers: Sequence[Offer]
    ) -> tuple[float, str]:
        """What ``spec`` would cost, where it is cheapest (a worker here that can ever run it,
        or an offer that fits it), and which; (0, "") when nothing can run it yet."""
        resources = spec.resources
        if resources.worker is not None:
            # Fits answers "waits for that worker" to a pinned job, which would quote it $0
            # (and no budget would ever refuse it): quote the named worker, and only it.
            workers = [w for w in workers if w.name == resources.worker]
            offers = []
            resources = resources.model_copy(update={"worker": None})
        templates = [(w.capabilities, w.labels) for w in workers]
        templates += [(offer_capabilities(o), o.labels) for o in offers]
        fits = Fits(templates)
        shape = fits.shape(resources)
        best: tuple[float, str] | None = None
        for i, (caps, _) in enumerate(templates):
            if not fits.fits(shape, i):
                continue
            if i < len(workers):
                w = workers[i]
                inst = self.instance_of(w.id)
                rate = (
                    inst.offer.unit_price if inst else self.owned_rate(w.name, bool(caps.devices))
                )
                where = f"worker {w.name}"
            else:
                o = offers[i - len(workers)]
                rate, where = o.unit_price, o.id
            cost = rate * fits.units(shape, i) * shape.nodes * self.hours(spec)
            if best is None or cost < best[0]:
                best = (cost, where)
        return best or (0.0, "")

    def remember(self, entries: Iterable[CostEntry]) -> None:
        """Charges read back at start: what jobs of each name typically take."""
        for e in entries:
            if e.kind == CostKind.CHARGE and e.seconds is not None and e.units:
                self._ran(e.job_name, e.seconds / e.units / 3600.0)

    def _ran(self, name: str, hours: float) -> None:
        self._runs.setdefault(name, deque(maxlen=TYPICAL_RUNS)).append(hours)

    # -- the commit path -------------------------------------------------------------------------

    def account(
        self, before: Job, after: Job, end: AttemptEnd | None = None
    ) -> tuple[Job, list[CostEntry]]:
        """The job with its history brought up to date, and the ledger rows to write with it."""
        b, a = before.state, after.state
        now = self.clock.now()
        if b == JobState.QUEUED and a == JobState.PLACED and after.placement is not None:
            record = self._placed(after, now)
            history = [*after.history, record]
            return after.model_copy(update={"history": history}), [self._row(after, record, now)]
        if not after.history or b not in (JobState.PLACED, JobState.RUNNING):
            return after, []
        last = after.history[-1]
        if last.attempt != before.attempts or last.ended_at is not None:
            return after, []  # not this attempt's record, or closed already: never twice
        if a == JobState.RUNNING:
            started = after.started_at or now
            return self._with_last(after, last.model_copy(update={"started_at": started})), []
        if not (a.terminal or a == JobState.QUEUED):
            return after, []
        record = self._ended(before, after, last, end, now)
        if record.gpu_seconds and record.units:
            self._ran(after.spec.name, record.gpu_seconds / record.units / 3600.0)
        updated = self._with_last(after, record)
        return updated, [self._row(updated, record, now)]

    def _placed(self, job: Job, now: float) -> AttemptRecord:
        assert job.placement is not None
        p = self.price(job)
        hours = self.hours(job)
        # Built without validation, every field given: computed here, never user input (a
        # placement and an end happen per job; validating both records cost ~30 us a job, and
        # ``model_construct`` was still half of the ledger's 180 us a job: ``built`` is a fifth).
        return built(
            AttemptRecord,
            {
                "attempt": job.attempts,
                "placed_at": job.placed_at or now,
                "started_at": None,
                "ended_at": None,
                "outcome": None,
                "reason": None,
                "exit_code": None,
                "retried": False,
                "retry_at": None,
                "workers": [n.worker_name for n in job.placement.nodes],
                "instances": list(p.instances),
                "provider": p.provider,
                "units": p.units,
                "unit_price": round(p.unit_price, 6),
                "estimate_hours": round(hours, 6),
                "estimate": round(p.units * p.unit_price * hours, 6),
                "gpu_seconds": None,
                "charge": None,
            },
        )

    def _ended(
        self, before: Job, after: Job, last: AttemptRecord, end: AttemptEnd | None, now: float
    ) -> AttemptRecord:
        ended = after.finished_at if after.state.terminal and after.finished_at else now
        if end is None:
            outcome: Outcome = after.state.value if after.state.terminal else "requeued"  # type: ignore[assignment]
            end = AttemptEnd(outcome, after.reason, after.exit_code)
        started = last.started_at or before.started_at
        held = max(0.0, ended - started) * last.units if started is not None else 0.0
        return last.model_copy(
            update={
                "started_at": started,
                "ended_at": ended,
                "outcome": end.outcome,
                "reason": end.reason,
                "exit_code": end.exit_code,
                "retried": after.state == JobState.QUEUED and end.outcome != "requeued",
                "retry_at": end.retry_at,
                "gpu_seconds": round(held, 3),
                "charge": round(held / 3600.0 * last.unit_price, 6),
            }
        )

    @staticmethod
    def _with_last(job: Job, record: AttemptRecord) -> Job:
        return job.model_copy(update={"history": [*job.history[:-1], record]})

    @staticmethod
    def _row(job: Job, r: AttemptRecord, now: float) -> CostEntry:
        charge = r.charge is not None
        return built(
            CostEntry,
            {
                "job_id": job.id,
                "attempt": r.attempt,
                "kind": CostKind.CHARGE if charge else CostKind.ESTIMATE,
                "amount": r.charge if r.charge is not None else r.estimate,
                "at": (r.ended_at or now) if charge else r.placed_at,
                "job_name": job.spec.name,
                "user": job.owner,
                "project": job.spec.labels.get(PROJECT_LABEL),
                "provider": r.provider,
                "instances": r.instances,
                "workers": r.workers,
                "units": r.units,
                "unit_price": r.unit_price,
                "seconds": r.gpu_seconds if charge else None,
            },
        )
