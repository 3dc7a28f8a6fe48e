"""``reconcile(instances, census, ...) -> Reconciliation``: what the providers' reports mean.

Pure, like ``plan_scaling``: the control plane's reconciler lists each provider's machines
(``Census``), calls this, and carries out what it returns. The rules, in one place:

- a machine GPUlayer recorded as *requested* that its provider reports is adopted (booting):
  a control plane killed between recording a launch and hearing its answer launches nothing
  twice; a live one whose id GPUlayer lacks (it joined before any round adopted it) gets the
  id its provider reports, so ending it reaches the machine; one that its provider does not
  know and no launch of ours is in flight for was never launched (the control plane stopped
  first): failed, so the planner launches again;
- a machine reported *preempted* is preempted, and its worker's jobs end ``lost`` with reason
  ``preempted`` (retried when they asked for it); one reported ended or failed (Slurm cancelled
  its batch job, its worker exited) failed, unless GPUlayer was ending it;
- a machine that did not join by its boot deadline is terminated as failed;
- a joined machine whose worker was lost or left is terminated as failed (nobody pays for a
  machine whose worker is gone);
- a machine a provider reports running that GPUlayer does not know, or already ended, is
  terminated: no leaked instances, ever;
- a machine on an *unlisted* offer (an unreachable SSH host) is left as it is: not seen is not
  gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..contracts import Instance, InstanceState
from ..providers.base import Census, Reported

S = InstanceState


@dataclass(frozen=True, slots=True)
class Change:
    instance_id: str
    state: InstanceState | None = None  # None: only ``external_id`` changes (adopted)
    reason: str | None = None
    external_id: str | None = None
    boot_failure: bool = False  # counts against its provider (backoff)


@dataclass(frozen=True, slots=True)
class Lose:
    worker_id: str
    why: str
    preempted: bool = False


@dataclass(frozen=True, slots=True)
class EndStray:
    provider: str
    external_id: str
    instance_id: str | None
    why: str


@dataclass(frozen=True, slots=True)
class Reconciliation:
    changes: tuple[Change, ...] = ()
    lose: tuple[Lose, ...] = ()
    terminate: tuple[str, ...] = ()  # instance ids to end at their provider
    strays: tuple[EndStray, ...] = ()
    charges: Mapping[str, float] = field(default_factory=dict)  # instance id -> provider's bill


def reconcile(
    instances: Mapping[str, Instance],
    census: Mapping[str, Census | None],
    *,
    now: float,
    in_flight: frozenset[str] = frozenset(),
    workers_live: Mapping[str, bool] | None = None,
) -> Reconciliation:
    """``census[provider]`` is None when its machines could not be listed at all this round.
    ``workers_live``: worker id -> in service (absent: unknown to the registry)."""
    live = workers_live or {}
    changes: list[Change] = []
    lose: list[Lose] = []
    terminate: list[str] = []
    strays: list[EndStray] = []
    charges: dict[str, float] = {}
    seen: dict[str, Reported] = {}
    for provider, listed in sorted(census.items()):
        for r in listed.reported if listed is not None else ():
            known = instances.get(r.instance_id or "")
            if known is None or known.provider != provider:
                if r.state in ("booting", "running"):
                    why = "a machine this control plane never launched (or forgot)"
                    strays.append(EndStray(provider, r.external_id, r.instance_id, why))
                continue
            seen.setdefault(known.id, r)
            if r.charge is not None:
                charges[known.id] = r.charge
    for inst in sorted(instances.values(), key=lambda i: i.id):
        c = census.get(inst.provider)
        rep = seen.get(inst.id)
        if inst.state.ended:
            if rep is not None and rep.state in ("booting", "running"):
                terminate.append(inst.id)  # ended here, still running there: end it again
            continue
        if c is None or inst.offer.id in c.unlisted:
            if inst.state in (S.REQUESTED, S.BOOTING) and now > inst.boot_deadline:
                changes.append(_failed(inst, _late(inst), boot=True))
                terminate.append(inst.id)
            continue
        worker = inst.worker_id
        if inst.id in in_flight and rep is not None and rep.state not in ("booting", "running"):
            continue  # its launch is still answering: that answer (or failure) says more
        if rep is not None and rep.state == "preempted":
            changes.append(Change(inst.id, S.PREEMPTED, f"preempted: {rep.detail}"))
            if worker:
                lose.append(Lose(worker, f"its instance {inst.id} was preempted", True))
            continue
        if rep is not None and rep.state in ("ended", "failed"):
            if inst.state == S.DRAINING:
                changes.append(Change(inst.id, S.TERMINATED, inst.reason or "scaled down"))
            else:
                why = f"its machine ended at {inst.provider}: {rep.detail or rep.state}"
                changes.append(_failed(inst, why, boot=inst.state != S.JOINED))
                if worker:
                    lose.append(Lose(worker, f"its instance {inst.id} ended ({rep.detail})"))
            continue
        if rep is None:
            if inst.id in in_flight:
                continue
            if inst.state == S.REQUESTED:
                why = "never launched: the control plane stopped before its provider answered"
                changes.append(_failed(inst, why, boot=False))
                continue
            if inst.state == S.DRAINING:
                # Being ended: a provider stops listing a machine it ended (an SSH host skips a
                # folder marked ended) a moment before its terminate answers. Gone is done.
                changes.append(Change(inst.id, S.TERMINATED, inst.reason or "scaled down"))
                continue
            why = f"{inst.provider} no longer reports its machine ({inst.external_id or '?'})"
            changes.append(_failed(inst, why, boot=inst.state == S.BOOTING))
            if worker:
                lose.append(Lose(worker, f"its instance {inst.id} is gone"))
            continue
        if inst.state == S.REQUESTED and rep.external_id:  # "": starting, nothing to adopt yet
            changes.append(Change(inst.id, S.BOOTING, None, rep.external_id))
        elif rep.external_id and rep.external_id != inst.external_id:
            # Joined before any round adopted it (its launch's answer lost with a killed
            # leader): its id is learnt now, so its end reaches the machine.
            changes.append(Change(inst.id, None, None, rep.external_id))
        if inst.state in (S.REQUESTED, S.BOOTING) and now > inst.boot_deadline:
            changes.append(_failed(inst, _late(inst), boot=True))
            terminate.append(inst.id)
        elif inst.state in (S.JOINED, S.DRAINING) and worker and not live.get(worker, False):
            if inst.state == S.DRAINING:
                changes.append(Change(inst.id, S.TERMINATED, inst.reason or "scaled down"))
            else:
                changes.append(_failed(inst, "its worker was lost or left", boot=False))
            terminate.append(inst.id)
    return Reconciliation(tuple(changes), tuple(lose), tuple(terminate), tuple(strays), charges)


def _failed(inst: Instance, why: str, *, boot: bool) -> Change:
    return Change(inst.id, S.FAILED, why, boot_failure=boot)


def _late(inst: Instance) -> str:
    took = inst.boot_deadline - inst.requested_at
    return f"its worker did not join within {took:.0f}s (boot timeout)"
