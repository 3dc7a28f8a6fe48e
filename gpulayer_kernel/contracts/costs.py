"""Cost contracts (ADR 0011): attempts with their estimate and charge, ledger rows, budgets.

Estimates and charges are distinct records. An attempt's *estimate* is made when it is placed
(its price per GPU-hour x its GPUs x its timeout, or the typical run time of jobs like it); its
*charge* when it ends (the price x the GPU-seconds it actually held). Both are keyed by
``(job, attempt, kind)``: a report delivered twice writes the same row twice, never two rows.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from ._base import Contract

Outcome = Literal["succeeded", "failed", "cancelled", "lost", "preempted", "requeued"]


class AttemptRecord(Contract):
    """One attempt of a job: where it ran, how it ended, what it was expected to cost and cost."""

    attempt: int = Field(ge=0)
    placed_at: float
    started_at: float | None = None
    ended_at: float | None = None
    outcome: Outcome | None = Field(None, description="None while the attempt is placed/running")
    reason: str | None = None
    exit_code: int | None = None
    retried: bool = Field(False, description="a new attempt followed this one")
    retry_at: float | None = Field(None, description="when the next attempt may start (backoff)")
    workers: list[str] = Field(default_factory=list, description="worker names, node order")
    instances: list[str] = Field(default_factory=list, description="provider instance ids")
    provider: str | None = None
    units: float = Field(0.0, ge=0, description="GPUs held (machines, for a CPU-only worker)")
    unit_price: float = Field(0.0, ge=0, description="dollars per unit-hour at placement")
    estimate_hours: float = Field(0.0, ge=0)
    estimate: float = Field(0.0, ge=0, description="dollars expected at placement")
    gpu_seconds: float | None = Field(None, ge=0, description="unit-seconds actually held")
    charge: float | None = Field(None, ge=0, description="dollars charged when it ended")


class CostKind(StrEnum):
    ESTIMATE = "estimate"
    CHARGE = "charge"


class CostEntry(Contract):
    """One ledger row: the estimate or the charge of one attempt (unique per job/attempt/kind)."""

    job_id: str
    attempt: int = Field(ge=0)
    kind: CostKind
    amount: float = Field(ge=0, description="dollars")
    at: float = Field(description="when it was recorded (placement or end)")
    job_name: str = ""
    user: str | None = None
    project: str | None = None
    provider: str | None = Field(None, description="None: hardware not launched by a provider")
    instances: list[str] = Field(default_factory=list)
    workers: list[str] = Field(default_factory=list)
    units: float = 0.0
    unit_price: float = 0.0
    seconds: float | None = Field(None, description="charge: unit-seconds held")


GroupBy = Literal["user", "job", "provider", "day", "project"]


class CostRow(Contract):
    """Costs summed over one group (a user, a job, a provider, a UTC day, a project)."""

    key: str = Field(description='the group ("-" for none: no user label, owned hardware)')
    estimate: float = 0.0
    charge: float = 0.0
    attempts: int = 0
    gpu_hours: float = 0.0
    open: int = Field(0, description="attempts still running (estimate, no charge yet)")
    reported: float | None = Field(
        None, description="by provider: what the provider itself billed for its instances"
    )


class CostReport(Contract):
    by: GroupBy
    since: float | None = None
    rows: list[CostRow]
    total_estimate: float = 0.0
    total_charge: float = 0.0


class BudgetPolicy(StrEnum):
    WARN = "warn"  # a running job that crosses it is warned (a log line, an event), not stopped
    CANCEL = "cancel"  # a running job that crosses it is cancelled, saying why


BudgetPeriod = Literal["total", "day", "week", "month"]


class Budget(Contract):
    """A spending limit for a user's or a project's jobs (matched on the job's labels)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    scope: Literal["user", "project"]
    match: str = Field(min_length=1, max_length=200, description="the user or project name")
    limit: float = Field(ge=0, description="dollars per period")
    period: BudgetPeriod = "month"
    policy: BudgetPolicy = BudgetPolicy.WARN


class BudgetStatus(Contract):
    budget: Budget
    spent: float = Field(description="charges of ended attempts this period")
    committed: float = Field(description="estimates of attempts placed or running now")
    left: float
    period_start: float | None = None


class BudgetList(Contract):
    budgets: list[BudgetStatus]
