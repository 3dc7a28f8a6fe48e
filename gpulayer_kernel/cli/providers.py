"""``gpulayer providers``, ``gpulayer costs`` and ``gpulayer budgets`` (ADR 0010, 0011).

Thin: each command parses its arguments, makes one call (the ControlPlane's or the HTTP
client's: ``open_session``), and prints the answer as a table (or JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from typing import Any

from ..client.connect import open_session
from ..contracts import (
    Budget,
    BudgetStatus,
    CostReport,
    Instance,
    ProviderCheck,
    ProviderList,
    parse,
)
from ..errors import InvalidInput
from ..security import parse_ttl
from ..words import dollars
from .common import Handler

GROUPS = ("job", "user", "project", "provider", "day")
COSTS_LIMIT = 50  # rows `gpulayer costs` shows unless told: a busy month has thousands of jobs


def add_parsers(sub: Any) -> None:
    """Add providers, costs and budgets to the ``gpulayer`` sub-parsers."""
    p = sub.add_parser(
        "providers",
        help="list the configured providers and check each (providers.toml)",
        description="List the providers of $GPULAYER_HOME/providers.toml and check each: "
        "reachable, its offers with their prices, its instances. Exits 1 when a check fails.",
    )
    p.add_argument("--json", action="store_true")
    psub = p.add_subparsers(dest="providers_command", metavar="{instances}")
    inst = psub.add_parser("instances", help="the machines GPUlayer launched, newest first")
    inst.add_argument("--all", action="store_true", help="ended ones too")
    inst.add_argument("--json", action="store_true")

    c = sub.add_parser("costs", help="estimates and charges, summed by job, user, provider, ...")
    c.add_argument("--by", choices=GROUPS, default="job")
    c.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help='a duration back from now ("7d", "12h"), a date ("2026-11-01", UTC) or epoch seconds',
    )
    c.add_argument(
        "--limit",
        type=int,
        default=COSTS_LIMIT,
        help=f"rows to show, the largest charges first (default {COSTS_LIMIT}; 0: all); "
        "the totals count every row",
    )
    c.add_argument("--json", action="store_true")

    b = sub.add_parser("budgets", help="spending limits per user or project")
    b.add_argument("--json", action="store_true")
    bsub = b.add_subparsers(dest="budgets_command", metavar="{set,delete}")
    bset = bsub.add_parser(
        "set",
        help="create or change a budget",
        description="A budget limits what the jobs labelled user=NAME (--user) or project=NAME "
        "(--project) may cost per period. A submit whose estimate is over what is left is "
        "refused; the autoscaler launches nothing it cannot pay for; a running job that "
        "crosses it is warned (or cancelled with --policy cancel).",
    )
    bset.add_argument("name")
    who = bset.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", default=None)
    who.add_argument("--project", default=None)
    bset.add_argument("--limit", type=float, required=True, metavar="DOLLARS")
    bset.add_argument("--period", choices=["total", "day", "week", "month"], default="month")
    bset.add_argument("--policy", choices=["warn", "cancel"], default="warn")
    bdel = bsub.add_parser("delete", help="delete a budget")
    bdel.add_argument("name")


# -- parsing -------------------------------------------------------------------------------------


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """``7d``/``12h``/``90`` (back from now), ``2026-11-01`` (UTC) or epoch seconds."""
    if text is None:
        return None
    now = time.time() if now is None else now
    raw = text.strip()
    try:
        number = float(raw)
    except ValueError:
        number = None
    if number is not None and number > 1e9:
        return number  # epoch seconds
    try:
        return now - (parse_ttl(raw) or 0.0)
    except InvalidInput:
        pass
    try:
        when = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(
            f"--since {text!r} is neither a duration, a date nor epoch seconds",
            hint="try --since 7d, --since 12h, --since 2026-11-01 or --since 1796000000",
            details={"field": "--since", "value": text},
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


# -- rendering -----------------------------------------------------------------------------------


def money(x: float | None) -> str:
    return "-" if x is None else dollars(x)


def providers_text(listing: ProviderList, now: float | None = None) -> str:
    if not listing.providers:
        where = listing.config or "$GPULAYER_HOME/providers.toml"
        return f"no providers configured (add some to {where}; see docs/providers.md)"
    now = time.time() if now is None else now
    lines = [f"{'NAME':<14}{'KIND':<7}{'CHECK':<7}{'INSTANCES':<11}DETAIL"]
    for p in listing.providers:
        lines.append(
            f"{p.name:<14}{p.kind:<7}{'ok' if p.ok else 'FAILED':<7}"
            f"{f'{p.instances}/{p.max_instances}':<11}{p.detail}"
        )
        lines.extend(f"  offer {offer_text(o)}" for o in p.offers)
        lines.extend(_provider_state(p, now))
    lines.append(
        "autoscaling: on (this control plane launches and ends machines)"
        if listing.autoscaling
        else "autoscaling: off here (it runs under `gpulayer serve`, whose workers can join)"
    )
    return "\n".join(lines)


def _provider_state(p: ProviderCheck, now: float) -> list[str]:
    out = []
    if p.backoff_until is not None and p.backoff_until > now:
        out.append(f"  backing off: no launch for {p.backoff_until - now:.0f}s more")
    if p.last_error:
        out.append(f"  last error: {p.last_error}")
    return out


def offer_text(o: Any) -> str:
    """``fake/a100x2: 2× a100 80 GiB, 2 CPUs, $4.20/h, ~5 s to boot (simulated)``."""
    what = f"{o.gpus}× {o.gpu_kind}" if o.gpus else "no GPUs"
    if o.gpus and o.gpu_memory:
        what += f" {o.gpu_memory / 2**30:.0f} GiB"
    extra = " (simulated)" if o.simulated else ""
    cap = f", at most {o.capacity} at once" if o.capacity is not None else ""
    return (
        f"{o.id}: {what}, {o.cpus} CPU{'s' if o.cpus != 1 else ''}, {money(o.price_per_hour)}/h, "
        f"~{o.boot_seconds:.0f} s to boot{cap}{extra}"
    )


def instances_text(instances: list[Instance], now: float | None = None) -> str:
    from ..render import age  # here: every command imports this module, `gpulayer run` too

    if not instances:
        return "no instances (the autoscaler launches them for jobs no worker here can take)"
    rows = [f"{'ID':<14}{'OFFER':<24}{'STATE':<12}{'WORKER':<20}{'REQUESTED':<11}WHY"]
    for i in instances:
        rows.append(
            f"{i.id:<14}{i.offer.id[:23]:<24}{i.state.value:<12}{i.worker_name[:19]:<20}"
            f"{age(i.requested_at, now):<11}{i.reason or ''}"
        )
    return "\n".join(rows)


def costs_text(report: CostReport, limit: int = 0) -> str:
    """The report as a table: its ``limit`` costliest rows (0: all), the totals of every row,
    and a "showing N of M" line when rows were left out."""
    if not report.rows:
        return "no costs recorded" + (" since then" if report.since is not None else " yet")
    every = len(report.rows)
    if 0 < limit < every:
        # The costliest first, then shown in the report's own order (a day stays a day).
        kept = set(map(id, sorted(report.rows, key=lambda r: -(r.charge + r.estimate))[:limit]))
        report = report.model_copy(update={"rows": [r for r in report.rows if id(r) in kept]})
    key = {"job": "JOB", "day": "DAY (UTC)"}.get(report.by, report.by.upper())
    width = max(len(key), *(len(r.key) for r in report.rows)) + 2
    reported = report.by == "provider"
    head = f"{key:<{width}}{'ESTIMATE':>11}{'CHARGE':>11}{'ATTEMPTS':>10}{'GPU-H':>9}{'OPEN':>6}"
    rows = [head + (f"{'BILLED':>11}" if reported else "")]
    for r in report.rows:
        line = (
            f"{r.key:<{width}}{money(r.estimate):>11}{money(r.charge):>11}{r.attempts:>10}"
            f"{r.gpu_hours:>9.2f}{r.open:>6}"
        )
        rows.append(line + (f"{money(r.reported):>11}" if reported else ""))
    rows.append(
        f"{'total':<{width}}{money(report.total_estimate):>11}{money(report.total_charge):>11}"
    )
    if len(report.rows) < every:
        rows.append(
            f"showing {len(report.rows)} of {every} rows, the costliest (--limit 0: all); "
            "the totals count all"
        )
    return "\n".join(rows)


def budgets_text(budgets: list[BudgetStatus]) -> str:
    if not budgets:
        return "no budgets; set one with: gpulayer budgets set NAME --project P --limit 100"
    rows = [
        f"{'NAME':<16}{'FOR':<22}{'LIMIT':>11}{'SPENT':>11}{'COMMITTED':>11}{'LEFT':>11}  "
        "PERIOD / POLICY"
    ]
    for s in budgets:
        b = s.budget
        who = f"{b.scope} {b.match}"[:21]
        rows.append(
            f"{b.name:<16}{who:<22}{money(b.limit):>11}{money(s.spent):>11}"
            f"{money(s.committed):>11}{money(max(0.0, s.left)):>11}  {b.period} / {b.policy.value}"
        )
    return "\n".join(rows)


def attempts_text(job: Any) -> str:
    from ..render import duration

    """A job's attempts, one per line, for ``gpulayer show --attempts``."""
    if not job.history:
        return f"job {job.id} has not been placed yet ({job.state.value})"
    rows = [f"{'#':<3}{'OUTCOME':<11}{'RAN':>9}{'ESTIMATE':>11}{'CHARGE':>11}  WHERE / WHY"]
    for a in job.history:
        ran = duration(a.ended_at - a.started_at) if a.started_at and a.ended_at else "-"
        where = ", ".join(a.workers) + (f" ({a.provider})" if a.provider else "")
        why = f": {a.reason}" if a.reason else ""
        retried = " -> retried" if a.retried else ""
        rows.append(
            f"{a.attempt:<3}{a.outcome or 'running':<11}{ran:>9}{money(a.estimate):>11}"
            f"{money(a.charge):>11}  {where}{why}{retried}"
        )
    return "\n".join(rows)


# -- commands ------------------------------------------------------------------------------------


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


async def cmd_providers(args: argparse.Namespace) -> int:
    async with open_session() as s:
        if getattr(args, "providers_command", None) == "instances":
            listing = await s.instances(ended=args.all)
            if args.json:
                _print_json(listing.model_dump(mode="json")["instances"])
            else:
                print(instances_text(listing.instances))
            return 0
        providers = await s.providers()
    if args.json:
        _print_json(providers.model_dump(mode="json"))
    else:
        print(providers_text(providers))
    return 0 if all(p.ok for p in providers.providers) else 1


async def cmd_costs(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise InvalidInput(
            f"--limit {args.limit} is negative",
            hint="a number of rows, or 0 for all of them",
            code="bad_limit",
        )
    since = parse_since(args.since)
    async with open_session() as s:
        report = await s.costs(args.by, since)
    if args.json:
        _print_json(report.model_dump(mode="json"))
    else:
        print(costs_text(report, args.limit))
    return 0


async def cmd_budgets(args: argparse.Namespace) -> int:
    command = getattr(args, "budgets_command", None)
    async with open_session() as s:
        if command == "set":
            scope, match = ("user", args.user) if args.user else ("project", args.project)
            budget = parse(
                Budget,
                {
                    "name": args.name,
                    "scope": scope,
                    "match": match,
                    "limit": args.limit,
                    "period": args.period,
                    "policy": args.policy,
                },
            )
            print(budgets_text([await s.set_budget(budget)]))
            return 0
        if command == "delete":
            await s.delete_budget(args.name)
            print(f"budget {args.name} deleted")
            return 0
        listing = await s.budgets()
    if args.json:
        _print_json(listing.model_dump(mode="json")["budgets"])
    else:
        print(budgets_text(listing.budgets))
    return 0


COMMANDS: dict[str, Handler] = {
    "providers": cmd_providers,
    "costs": cmd_costs,
    "budgets": cmd_budgets,
}
