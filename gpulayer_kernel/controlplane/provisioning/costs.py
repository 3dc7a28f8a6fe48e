"""``gpulayer costs``: the ledger's rows summed by user, job, provider, UTC day or project.

Each attempt counts once: its estimate (always), its charge once it ended. By provider, what the
providers themselves billed for their instances (``Instance.charge_reported``: the fake bills
per second; Slurm without accounting and an SSH fleet report nothing) stands beside GPUlayer's
own charges, so the two can be reconciled; the difference is the machines' idle and boot time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from ...contracts import CostEntry, CostKind, CostReport, CostRow, Instance
from ...contracts.costs import GroupBy

NONE = "-"


def _key(e: CostEntry, by: GroupBy) -> str:
    if by == "job":
        return f"{e.job_id} {e.job_name}"
    if by == "day":
        return time.strftime("%Y-%m-%d", time.gmtime(e.at))
    value = {"user": e.user, "project": e.project, "provider": e.provider}[by]
    return value or NONE


def summarize(
    entries: Iterable[CostEntry],
    by: GroupBy,
    *,
    since: float | None = None,
    instances: Sequence[Instance] = (),
) -> CostReport:
    """Rows per group, largest charge first (then by key); an attempt's day is its placement's."""
    attempts: dict[tuple[str, int], dict[CostKind, CostEntry]] = {}
    for e in entries:
        attempts.setdefault((e.job_id, e.attempt), {})[e.kind] = e
    rows: dict[str, dict[str, float]] = {}
    for kinds in attempts.values():
        est = kinds.get(CostKind.ESTIMATE)
        charge = kinds.get(CostKind.CHARGE)
        first = est or charge
        assert first is not None
        row = rows.setdefault(_key(first, by), dict.fromkeys(("e", "c", "n", "h", "o"), 0.0))
        row["n"] += 1
        row["e"] += est.amount if est else 0.0
        if charge is None:
            row["o"] += 1
        else:
            row["c"] += charge.amount
            row["h"] += (charge.seconds or 0.0) / 3600.0
    reported: dict[str, float] = {}
    if by == "provider":
        for inst in instances:
            if inst.charge_reported is not None and (
                since is None or (inst.ended_at or time.time()) >= since
            ):
                reported[inst.provider] = reported.get(inst.provider, 0.0) + inst.charge_reported
    out = [
        CostRow(
            key=k,
            estimate=round(v["e"], 6),
            charge=round(v["c"], 6),
            attempts=int(v["n"]),
            gpu_hours=round(v["h"], 6),
            open=int(v["o"]),
            reported=round(reported[k], 6) if k in reported else None,
        )
        for k, v in rows.items()
    ]
    for k, amount in reported.items():
        if k not in rows:
            out.append(CostRow(key=k, reported=round(amount, 6)))
    out.sort(key=lambda r: (-r.charge, -r.estimate, r.key))
    return CostReport(
        by=by,
        since=since,
        rows=out,
        total_estimate=round(sum(r.estimate for r in out), 6),
        total_charge=round(sum(r.charge for r in out), 6),
    )
