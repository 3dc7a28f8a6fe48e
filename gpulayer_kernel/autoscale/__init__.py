"""The autoscaler's pure half (ADR 0010), beside the scheduler: decide, never do.

- ``plan_scaling(snapshot, offers, budgets) -> ScalingPlan`` (plan.py): launches for waiting jobs
  (cheapest offer that fits, within limits, max $/h and budgets), terminations of idle machines,
  and a note per waiting job that the one renderer (``scheduler.explain``) words;
- ``reconcile(instances, census, ...)`` (reconcile.py): what the providers' reports mean for
  GPUlayer's instance records (adopt, fail, preempt, end strays);
- ``Fits`` (fit.py): whether a job runs on an offer's worker, by the scheduler's own checks.

No I/O, no clock, no randomness: the control plane's
``controlplane/provisioning/autoscaler.py`` does the doing, on its clock.
"""

from __future__ import annotations

from .fit import Fits, offer_capabilities
from .model import (
    InstanceView,
    Launch,
    PendingJob,
    ProviderView,
    ScalingPlan,
    ScalingSnapshot,
    Terminate,
)
from .plan import plan_scaling
from .reconcile import Reconciliation, reconcile

__all__ = [
    "Fits",
    "InstanceView",
    "Launch",
    "PendingJob",
    "ProviderView",
    "Reconciliation",
    "ScalingPlan",
    "ScalingSnapshot",
    "Terminate",
    "offer_capabilities",
    "plan_scaling",
    "reconcile",
]
