"""The control plane's Prometheus metrics (ADR 0020): one registry per ControlPlane.

``GET /api/v1/metrics`` (a viewer token) serves ``Metrics.exposition()``. Two kinds of series:

- **Read at scrape time** (``_StateCollector``): jobs, queue, waits, workers, GPUs, sessions and
  budgets come from what the control plane already holds in memory, so a scrape costs no store
  query and nothing on any hot path.
- **Observed on hot paths**: request latency per route (``api/mixin.py``), one scheduling pass
  (``scheduling.py``), one group commit (``store/group.py``), finished jobs and ledger rows (the
  job table's change hook). An observation is a few float additions under a lock.

A registry per control plane, never prometheus_client's global one: several control planes live
in one test process, and each must answer for its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..contracts import CostEntry, CostKind, Job, JobState, SessionStatus, WorkerState
from ..store.group import GroupCommit

if TYPE_CHECKING:
    from ..clock import Clock
    from .jobs import JobTable
    from .provisioning.ledger import Ledger
    from .provisioning.part import Provisioning
    from .scheduling import SchedulingLoop
    from .sessions.table import SessionTable
    from .workers import WorkerRegistry


class Observed(Protocol):
    """The parts of a control plane its series are read from at scrape time (the ControlPlane
    is one; a protocol, so this module sits below ``core`` and imports nothing back)."""

    clock: Clock
    jobs: JobTable
    sessions: SessionTable
    registry: WorkerRegistry
    provisioning: Provisioning


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Request latency: from a 1 ms long-poll answer to a 30 s one.
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A scheduling pass and a group commit: sub-millisecond to a second.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

# Why a queued job waits, as a small fixed set of classes (labels must not explode): the first
# that applies, in this order.
WAIT_CLASSES = ("retry_backoff", "quota", "reservation", "capacity", "unschedulable", "unplanned")


def wait_class(job: Job, now: float) -> str:
    """The reason class of a queued job's wait (``WAIT_CLASSES``)."""
    if job.retry_at is not None and job.retry_at > now:
        return "retry_backoff"
    report = job.pending
    if report is None:
        return "unplanned"  # submitted, no pass has looked at it yet
    if report.quota:
        return "quota"
    if report.reserved_by:
        return "reservation"
    if report.exhausted or report.workers_feasible:
        return "capacity"  # some worker could run it once GPUs free: waiting helps
    return "unschedulable"  # only filters: waiting helps only if new workers join


class Metrics:
    """The registry of one control plane and its hot-path instruments."""

    def __init__(self, cp: Observed) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Histogram(
            "gpulayer_http_request_duration_seconds",
            "HTTP API requests, by route template, method and status",
            ("route", "method", "status"),
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self.passes = Histogram(
            "gpulayer_scheduling_pass_seconds",
            "one scheduling pass: snapshot, plan, staging the placements",
            buckets=_FAST_BUCKETS,
            registry=self.registry,
        )
        self.commits = Histogram(
            "gpulayer_store_commit_seconds",
            "one group commit of the metadata store (every write queued meanwhile rides in it)",
            buckets=_FAST_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "gpulayer_jobs_finished",
            "jobs that reached a terminal state since this server became leader",
            ("state",),
            registry=self.registry,
        )
        self.ledger = Counter(
            "gpulayer_ledger_dollars",
            "ledger rows written since this server became leader, in dollars, by kind",
            ("kind",),
            registry=self.registry,
        )
        self.ledger_rows = Counter(
            "gpulayer_ledger_rows",
            "ledger rows written since this server became leader, by kind",
            ("kind",),
            registry=self.registry,
        )
        for state in JobState:
            if state.terminal:
                self.finished.labels(state.value)  # a zero series from the start, not a gap
        for kind in CostKind:
            self.ledger.labels(kind.value)
            self.ledger_rows.labels(kind.value)
        self.registry.register(_StateCollector(cp))

    def request_done(self, route: str, method: str, status: int, seconds: float) -> None:
        """Time one API request. The labelled child is cached: ``labels()`` validates and locks
        on every call, about twice the cost of the observation itself (measured)."""
        key = (route, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(route, method, str(status))
        child.observe(seconds)

    def job_changed(self, before: Job, after: Job) -> None:
        if after.state != before.state and after.state.terminal:
            self.finished.labels(after.state.value).inc()

    def instrument(self, scheduling: SchedulingLoop, store: object, ledger: Ledger) -> None:
        """Hook the hot paths' timers: scheduling passes, the store's group commits (a store
        that commits in groups), and the ledger's rows (after the budgets have seen them)."""
        scheduling.on_pass = self.passes.observe
        if isinstance(store, GroupCommit):
            store.on_commit = self.commits.observe
        budget_rows = ledger.on_rows

        def on_rows(rows: Sequence[CostEntry]) -> None:
            budget_rows(rows)
            self.ledger_rows_written(rows)

        ledger.on_rows = on_rows

    def ledger_rows_written(self, rows: Sequence[CostEntry]) -> None:
        for row in rows:
            kind = row.kind.value
            self.ledger.labels(kind).inc(row.amount)
            self.ledger_rows.labels(kind).inc()

    def exposition(self) -> bytes:
        """The text exposition format (version 0.0.4) of every series."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Series read from the control plane's memory at scrape time (no store query)."""

    def __init__(self, cp: Observed) -> None:
        self.cp = cp

    def collect(self) -> Iterator[Metric]:
        cp = self.cp
        now = cp.clock.now()
        active = cp.jobs.active()
        by_state = {s.value: 0 for s in JobState if not s.terminal}
        waits: dict[str, list[float]] = {c: [0, 0.0, 0.0] for c in WAIT_CLASSES}  # n, sum, max
        for job in active:
            by_state[job.state.value] = by_state.get(job.state.value, 0) + 1
            if job.state == JobState.QUEUED:
                w = waits[wait_class(job, now)]
                waited = max(0.0, now - job.submitted_at)
                w[0] += 1
                w[1] += waited
                w[2] = max(w[2], waited)
        jobs = GaugeMetricFamily(
            "gpulayer_jobs",
            "active jobs by state (finished ones: gpulayer_jobs_finished_total)",
            labels=("state",),
        )
        for state, n in by_state.items():
            jobs.add_metric((state,), n)
        yield jobs
        yield GaugeMetricFamily(
            "gpulayer_queue_depth", "jobs waiting to be placed", value=by_state["queued"]
        )
        count = GaugeMetricFamily(
            "gpulayer_queue_waiting", "queued jobs by why they wait", labels=("reason",)
        )
        total = GaugeMetricFamily(
            "gpulayer_queue_wait_seconds_sum",
            "seconds the queued jobs of each reason class have waited so far, summed",
            labels=("reason",),
        )
        oldest = GaugeMetricFamily(
            "gpulayer_queue_wait_seconds_max",
            "the longest wait so far among the queued jobs of each reason class",
            labels=("reason",),
        )
        for reason, (queued, summed, most) in waits.items():
            count.add_metric((reason,), queued)
            total.add_metric((reason,), summed)
            oldest.add_metric((reason,), most)
        yield from (count, total, oldest)
        yield from self._workers()
        sessions = GaugeMetricFamily(
            "gpulayer_sessions", "notebook sessions by status", labels=("status",)
        )
        statuses = {s.value: 0 for s in SessionStatus}
        for info in cp.sessions.live():
            statuses[info.status.value] = statuses.get(info.status.value, 0) + 1
        for status, n in statuses.items():
            sessions.add_metric((status,), n)
        yield sessions
        yield from self._budgets()

    def _workers(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily("gpulayer_workers", "workers by state", labels=("state",))
        gpus = GaugeMetricFamily(
            "gpulayer_gpus",
            "GPUs by state: busy (a job holds it), idle, unavailable (its worker is draining, "
            "cordoned or suspect), gone (lost or offline worker)",
            labels=("state",),
        )
        counts = {s.value: 0 for s in WorkerState}
        gpu_counts = {"busy": 0, "idle": 0, "unavailable": 0, "gone": 0}
        for w in self.cp.registry.all():
            counts[w.state.value] += 1
            for d in w.capabilities.devices:
                if not w.state.live:
                    gpu_counts["gone"] += 1
                elif d.index in w.device_jobs:
                    gpu_counts["busy"] += 1
                elif w.schedulable:
                    gpu_counts["idle"] += 1
                else:
                    gpu_counts["unavailable"] += 1
        for state, n in counts.items():
            workers.add_metric((state,), n)
        for state, n in gpu_counts.items():
            gpus.add_metric((state,), n)
        yield from (workers, gpus)

    def _budgets(self) -> Iterator[Metric]:
        budgets = self.cp.provisioning.budgets
        spent = GaugeMetricFamily(
            "gpulayer_budget_spent_dollars",
            "what each budget has spent this period",
            labels=("budget",),
        )
        for status in budgets.status():  # O(budgets x active jobs): a scrape every 15 s
            spent.add_metric((status.budget.name,), status.spent)
        yield spent


def timer() -> float:
    """The clock hot paths time themselves with (monotonic, sub-microsecond)."""
    return time.perf_counter()
