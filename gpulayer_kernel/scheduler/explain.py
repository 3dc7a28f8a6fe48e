"""Stage 4, explanation: the one renderer of placement sentences (STYLE: explaining placement).

A waiting job gets a ``PlacementReport``: per reason code the number of workers and a human detail,
``filtered`` (waiting won't help) kept apart from ``exhausted`` (waiting helps). ``render`` turns a
report into the one sentence shape::

    0/4 workers can run job 3f2a9c1d: 3 have too few free GPUs (need 2; waiting helps),
    1 has no GPU of kind h100 (waiting won't help); position 2 in the queue

A job held back by its user's quota, or put behind other users' jobs by fair share (share.py),
says so after the reasons: ``…; alice is at their quota (4/4 GPUs; waiting helps); behind 2 jobs
of users with less recent use; position 5 in the queue`` (``noted``).

Where providers are configured, the autoscaler's note on a waiting job (``report.scaling``) is
worded here too, after the workers' part (``scaling_sentence``; ``with_scaling`` adds it to a
rendered report, exactly as ``render`` would)::

    0/1 workers can run job 3f2a9c1d: 1 has too few free GPUs (need 2; waiting helps); slurm/
    gpu-2gpu can launch one (≈ $4.20/h, ~40 s): launching it; position 1 in the queue

A placed job's sentence (``placed on w1 devices [0,1]: tightest fit, 0 GPUs left free``) is
``placed.py``'s: it changes with the placement policy, these with the reasons a job waits.

Reports are built once per distinct (shape, reservations in the way) and copied per job with only
``job_id``, ``position`` and ``sentence`` changed; ``finish`` renders the sentence from the
template's sentence split around the job id (``sentence_parts``), which is exactly what ``render``
would give (a test holds the two together).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..capabilities.kinds import format_bytes
from ..contracts import (
    Job,
    PlacementReport,
    Reason,
    ReasonCount,
    Resources,
    ScalingCode,
    ScalingNote,
    SessionHold,
)
from ..words import dollars
from .feasible import Shape
from .memo import Memo

SHORT_ID = 8
NO_WORKERS = "no workers have joined yet; start one with `gpulayer worker`"
NO_WORKERS_YET = "no workers have joined yet"

# The documented check order; ties in a sentence follow it.
STAGE_ORDER: tuple[Reason, ...] = (
    Reason.WORKER_NOT_READY,
    Reason.UNSCHEDULABLE,
    Reason.WORKER_SUSPECT,
    Reason.CORDONED,
    Reason.DRAINING,
    Reason.SELECTOR_MISMATCH,
    Reason.NAME_MISMATCH,
    Reason.NO_GPUS,
    Reason.GPU_KIND,
    Reason.UNSUPPORTED_VENDOR,
    Reason.MPS_DISTRIBUTED,
    Reason.GPU_MEMORY,
    Reason.TOO_FEW_GPUS_TOTAL,
    Reason.CPUS_TOTAL,
    Reason.TOO_FEW_NODES,
    Reason.GPUS_BUSY,
    Reason.CPUS_BUSY,
    Reason.RESERVED,
    Reason.NOT_ENOUGH_NODES,
)
_STAGE = {code: i for i, code in enumerate(STAGE_ORDER)}
# Codes whose detail reads after "is"/"are"; the rest read after "has"/"have".
_COPULA = frozenset(
    {
        Reason.WORKER_NOT_READY,
        Reason.UNSCHEDULABLE,
        Reason.WORKER_SUSPECT,
        Reason.CORDONED,
        Reason.DRAINING,
        Reason.NAME_MISMATCH,
        Reason.TOO_FEW_NODES,
    }
)


def short(job_id: str) -> str:
    """The job id as sentences show it."""
    return job_id[:SHORT_ID]


def gpu_count(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def detail(
    code: Reason, shape: Shape, *, owners: Sequence[str] = (), why: str = "", qualifying: int = 0
) -> str:
    """The human detail beside ``code`` for a job of ``shape`` (a phrase after has/have, is/are)."""
    if code is Reason.WORKER_NOT_READY:
        return "not ready (lost or offline)"
    if code is Reason.UNSCHEDULABLE:
        return "set aside as unschedulable (see `gpulayer workers`)"
    if code is Reason.WORKER_SUSPECT:
        return "suspect (its connection closed)"
    if code is Reason.CORDONED:
        return "cordoned"
    if code is Reason.DRAINING:
        return "draining"
    if code is Reason.SELECTOR_MISMATCH:
        wanted = ", ".join(f"{k}={v}" for k, v in shape.selector)
        return f"labels that don't match {wanted}"
    if code is Reason.NAME_MISMATCH:
        return f"not named {shape.worker}"
    if code is Reason.NO_GPUS:
        return 'no GPUs (the job did not ask for fallback=["cpu"])'
    if code is Reason.GPU_KIND:
        return "no GPU of kind " + " or ".join(shape.kinds)
    if code is Reason.UNSUPPORTED_VENDOR:
        return f"no usable GPU of that kind ({why})" if why else "no usable GPU of that kind"
    if code is Reason.MPS_DISTRIBUTED:
        need = f"need {shape.nodes} nodes" if shape.nodes > 1 else f"need {shape.gpus}"
        return f"only Apple MPS, which runs single-device jobs ({need})"
    if code is Reason.GPU_MEMORY:
        memory = min((c.memory_min for c in shape.choices if c.memory_min), default=0)
        return f"no GPU with {format_bytes(memory)} or more"
    if code is Reason.TOO_FEW_GPUS_TOTAL:
        return f"too few suitable GPUs in all (need {shape.gpus})"
    if code is Reason.CPUS_TOTAL:
        return f"too few CPUs in all (need {shape.cpus:g})"
    if code is Reason.TOO_FEW_NODES:
        return f"suitable but too few (need {shape.nodes} workers)"
    if code is Reason.GPUS_BUSY:
        return f"too few free GPUs (need {shape.gpus})"
    if code is Reason.CPUS_BUSY:
        return f"too few free CPUs (need {shape.cpus:g})"
    if code is Reason.RESERVED:
        shown = [short(o) for o in owners[:2]] + (["..."] if len(owners) > 2 else [])
        noun = "job" if len(owners) == 1 else "jobs"
        return f"GPUs reserved for {noun} {', '.join(shown)}" if owners else "GPUs reserved"
    return f"room now, but the job needs {shape.nodes} workers at once"  # NOT_ENOUGH_NODES


def _with_note(text: str, helps: bool) -> str:
    note = "waiting helps" if helps else "waiting won't help"
    if text.endswith(")") and "(" in text:
        return f"{text[:-1]}; {note})"
    return f"{text} ({note})"


def _part(rc: ReasonCount) -> str:
    return f"{rc.workers} {_verb(rc)} {_with_note(rc.detail, rc.waiting_helps)}"


def _position(position: int | None) -> str:
    return "" if position is None else f"; position {position} in the queue"


def render(report: PlacementReport, now: float | None = None) -> str:
    """The one sentence shape for a waiting job (``now``: for how long sessions are idle)."""
    head = f"{report.workers_feasible}/{report.workers_total} workers can run job "
    head += short(report.job_id)
    scaling = f"; {scaling_sentence(report.scaling)}" if report.scaling is not None else ""
    if report.workers_total == 0:
        none = NO_WORKERS_YET if scaling else NO_WORKERS
        return f"{head}: {none}{scaling}{_position(report.position)}"
    if report.nodes > 1:
        head += f", which needs {report.nodes} at once"
    reasons = sorted(
        [*report.filtered, *report.exhausted], key=lambda rc: (-rc.workers, _STAGE[rc.code])
    )
    parts = [_part(rc) for rc in reasons]
    if report.quota:
        parts.insert(0, _with_note(report.quota, True))
    body = ", ".join(parts) or "no reason recorded"
    tail = ""
    if report.reservation:
        tail = f"; GPUs are reserved for it on {', '.join(report.reservation)}"
    if report.fair_share:
        tail += f"; {report.fair_share}"
    if report.sessions:
        tail += "; " + held_by_sessions(report.sessions, now)
    return f"{head}: {body}{tail}{scaling}{_position(report.position)}"


# ------------------------------------------------------------------------------------------------
# what the autoscaler can do (providers, ADR 0010)


def _dollars(x: float | None) -> str:
    return dollars(x or 0.0)


def scaling_sentence(note: ScalingNote) -> str:
    """The autoscaler's part of a waiting job's sentence."""
    code = note.code
    if code is ScalingCode.NO_OFFER:
        return f"no provider offers a machine for it (it needs {note.detail or 'more'})"
    if code is ScalingCode.BOOTING:
        ids = ", ".join(short(i) for i in note.instances)
        verb = "is" if len(note.instances) == 1 else "are"
        noun = "instance" if len(note.instances) == 1 else "instances"
        left = f" (~{note.boot_seconds:.0f} s left)" if note.boot_seconds else ""
        return f"{noun} {ids} of {note.offer} {verb} booting for it{left}"
    if note.offer is None:  # PROVIDER_ERROR with no offer known: a provider is down
        return f"no provider can offer a machine for it now ({note.detail or 'no answer'})"
    offer, boot = note.offer, note.boot_seconds
    price = f"≈ {_dollars(note.price_per_hour)}/h" + (
        f", ~{boot:.0f} s" if boot is not None else ""
    )
    one = "one" if note.machines == 1 else str(note.machines)
    if code is ScalingCode.LAUNCHING:
        return f"{offer} can launch {one} ({price}): launching {'it' if one == 'one' else 'them'}"
    could = f"{offer} could launch {one} ({price}), but"
    if code is ScalingCode.OVER_BUDGET:
        need = f"≈ {_dollars(note.estimate)} needed, " if note.estimate else ""
        return (
            f"{could} it would exceed budget `{note.budget}` "
            f"({need}{_dollars(max(0.0, note.budget_left or 0.0))} left)"
        )
    if code is ScalingCode.MAX_PRICE:
        running = f" ({note.detail})" if note.detail else ""
        return f"{could} that would pass the max of {_dollars(note.limit)}/h{running}"
    if code is ScalingCode.PROVIDER_LIMIT:
        if note.detail:
            return f"{could} {note.detail} (at most {note.limit or 0:.0f} at once)"
        return f"{could} {offer.split('/')[0]} is at its limit of {note.limit or 0:.0f} instances"
    if code is ScalingCode.PROVIDER_BACKOFF:
        failed = f"its last {note.limit:.0f} launch(es) failed" if note.limit else "launches failed"
        why = f" ({note.detail})" if note.detail else ""
        wait = f"; next try in {note.retry_in:.0f} s" if note.retry_in is not None else ""
        return f"{could} {failed}{why}{wait}"
    return f"{could} {offer.split('/')[0]} cannot launch now ({note.detail or 'no answer'})"


def with_scaling(report: PlacementReport, note: ScalingNote | None) -> PlacementReport:
    """``report`` (rendered) with the autoscaler's note: exactly ``render``'s sentence for it,
    built from the rendered one (a test holds the two together)."""
    if note is None and report.scaling is None:
        return report
    base = report if report.scaling is None else _without_scaling(report)
    if note is None:
        return base
    tail = _position(base.position)
    text = base.sentence[: len(base.sentence) - len(tail)] if tail else base.sentence
    if base.workers_total == 0 and text.endswith(NO_WORKERS):
        text = text[: -len(NO_WORKERS)] + NO_WORKERS_YET
    sentence = f"{text}; {scaling_sentence(note)}{tail}"
    return base.model_copy(update={"scaling": note, "sentence": sentence})


def _without_scaling(report: PlacementReport) -> PlacementReport:
    plain = report.model_copy(update={"scaling": None})
    return plain.model_copy(update={"sentence": render(plain)})


def noted(report: PlacementReport, quota: str | None, fair_share: str | None) -> PlacementReport:
    """``report`` with its quota and fair-share notes, and the sentence that says them."""
    with_notes = report.model_copy(update={"quota": quota, "fair_share": fair_share})
    return with_notes.model_copy(update={"sentence": render(with_notes)})


def held_by_sessions(holds: Sequence[SessionHold], now: float | None) -> str:
    """``2 GPUs held by the idle session of `train.ipynb` for 12 min`` (the two largest)."""
    parts = []
    for h in sorted(holds, key=lambda h: (-h.gpus, h.name))[:2]:
        if h.idle_since is None:
            state = "the busy session"
            since = ""
        else:
            state = "the idle session"
            idle = max(0.0, (now if now is not None else h.idle_since) - h.idle_since)
            since = f" for {_minutes(idle)}"
        parts.append(f"{gpu_count(h.gpus)} held by {state} of {h.holder} on {h.worker}{since}")
    more = len(holds) - len(parts)
    extra = f" (and {more} more session{'s' if more > 1 else ''})" if more > 0 else ""
    return ", ".join(parts) + extra


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.0f} min"


def with_sessions(
    report: PlacementReport, holds: Sequence[SessionHold], now: float
) -> PlacementReport:
    """``report`` naming the sessions that hold GPUs it waits for (its sentence re-rendered)."""
    held = report.model_copy(update={"sessions": list(holds)})
    return held.model_copy(update={"sentence": render(held, now)})


def make_report(
    shape: Shape,
    counts: Mapping[Reason, int],
    *,
    total: int,
    feasible: int,
    owners: Sequence[str] = (),
    why: str = "",
    reservation: Sequence[str] = (),
    candidates: Sequence[str] = (),
    counts_memo: Memo[tuple[Reason, int, str], ReasonCount] | None = None,
    largest_gpus: int | None = None,
    largest_cpus: int | None = None,
) -> PlacementReport:
    """A report template (``job_id`` empty) from per-reason worker counts. ``counts_memo``
    shares one ``ReasonCount`` between reports that count the same thing (frozen, equal by
    value: sharing changes nothing but the allocations)."""
    filtered: list[ReasonCount] = []
    exhausted: list[ReasonCount] = []
    for code in sorted(counts, key=_STAGE.__getitem__):
        n = counts[code]
        if not n:
            continue
        text = detail(code, shape, owners=owners, why=why)
        rc = counts_memo.get((code, n, text)) if counts_memo is not None else None
        if rc is None:
            rc = ReasonCount(code=code, workers=n, detail=text, waiting_helps=code.waiting_helps)
            if counts_memo is not None:
                counts_memo.put((code, n, text), rc)
        (exhausted if rc.waiting_helps else filtered).append(rc)
    template = PlacementReport(
        job_id="",
        workers_total=total,
        workers_feasible=feasible,
        filtered=filtered,
        exhausted=exhausted,
        reserved_by=owners[0] if owners else None,
        reservation=list(reservation),
        nodes=shape.nodes,
        candidates=list(candidates),
        largest_gpus=largest_gpus,
        largest_cpus=largest_cpus,
    )
    return template


def sentence_parts(template: PlacementReport) -> tuple[str, str]:
    """``render``'s sentence for ``template`` split around the job id (position left out), so
    each job's sentence is two concatenations: ``finish`` below."""
    marker = "\x00"
    text = render(template.model_copy(update={"job_id": marker, "position": None}))
    before, _, after = text.partition(marker)
    return before, after


def finish(
    template: PlacementReport, parts: tuple[str, str], job_id: str, position: int
) -> PlacementReport:
    """``template`` for one job: its id, queue position and sentence (exactly ``render``'s).

    The same as ``template.model_copy(update=...)`` with those three fields, at under half the
    cost: a 10,000-job pass makes one for each of its ~7,000 waiting jobs, and pydantic's
    ``model_copy`` goes through ``copy.copy`` three times a call (~1.9 us; this ~0.8 us). As
    shallow as ``model_copy``'s copy (the frozen reason lists are shared); a test holds the two
    equal.
    """
    fields = template.__dict__.copy()  # a plain dict's copy: faster than rebuilding one
    fields["job_id"] = job_id
    fields["position"] = position
    fields["sentence"] = (
        f"{parts[0]}{job_id[:SHORT_ID]}{parts[1]}; position {position} in the queue"
    )
    report = _new(PlacementReport)
    _set(report, "__dict__", fields)
    _set(report, "__pydantic_fields_set__", template.__pydantic_fields_set__ | _FINISHED)
    _set(report, "__pydantic_extra__", None)
    _set(report, "__pydantic_private__", None)
    return report


_FINISHED = frozenset({"job_id", "position", "sentence"})
_new = PlacementReport.__new__
_set = object.__setattr__


# ------------------------------------------------------------------------------------------------
# jobs that can never fit


def never_sentence(report: PlacementReport, r: Resources) -> str:
    """Why a job that no worker here can ever run (``report.never_fits``) fails, saying what
    exists: ``job 3f2a9c1d can never run on the workers here: it needs 4 GPUs on one worker,
    and the largest worker has 2. 1 has too few suitable GPUs in all (need 4), 1 has no GPUs.
    Submit it with --wait to keep it queued until a worker that can run it joins.``"""
    codes = sorted(report.filtered, key=lambda rc: (-rc.workers, _STAGE[rc.code]))
    first = codes[0].code if codes else None
    per_node = f"{gpu_count(r.gpus)} on " + (
        f"each of {r.nodes} workers" if r.nodes > 1 else "one worker"
    )
    kinds = " or ".join(r.gpu_kind)
    memory = f" with {format_bytes(r.gpu_memory_min)} or more" if r.gpu_memory_min else ""
    which = (f" of kind {kinds}" if kinds else "") + memory
    if first is Reason.TOO_FEW_NODES:
        n = codes[0].workers
        what = f"{r.nodes} workers at once, and only {n} {'is' if n == 1 else 'are'} suitable"
    elif first is Reason.CPUS_TOTAL and r.cpus is not None:
        what = f"{r.cpus:g} CPUs, and the largest worker has {report.largest_cpus or 0}"
    elif first is Reason.SELECTOR_MISMATCH:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(r.selector.items()))
        what = f"a worker labelled {wanted}, and none is"
    elif first is Reason.NAME_MISMATCH:
        what = f"the worker {r.worker}, and no worker has that name"
    elif r.gpus and report.largest_gpus is not None:
        has = report.largest_gpus
        what = f"{per_node}{which}, and " + (
            f"the largest worker has {has}" if has else "no worker has any"
        )
    else:
        what = f"{per_node}{which}"
    body = ", ".join(
        f"{rc.workers} {_verb(rc)} {rc.detail}"
        for rc in sorted(report.filtered, key=lambda rc: (-rc.workers, _STAGE[rc.code]))
    )
    return (
        f"job {short(report.job_id)} can never run on the workers here: it needs {what}. "
        f"{body[:1].upper()}{body[1:]}. Submit it with --wait to keep it queued until a worker "
        "that can run it joins."
    )


def _verb(rc: ReasonCount) -> str:
    one, many = ("is", "are") if rc.code in _COPULA else ("has", "have")
    return one if rc.workers == 1 else many


def waits_for_gpus(job: Job, report: PlacementReport) -> bool:
    """Whether a waiting job waits for GPUs that are taken (a session may be holding them)."""
    if job.spec.resources.gpus == 0 or not report.candidates:
        return False
    return any(rc.code in (Reason.GPUS_BUSY, Reason.NOT_ENOUGH_NODES) for rc in report.exhausted)


def with_holds(
    report: PlacementReport,
    holds: list[SessionHold],
    now: float,
    seen: dict[int, list[SessionHold]],
) -> PlacementReport:
    """The report naming the sessions that hold GPUs on its candidate workers, if any do.

    ``seen``: the holds found per candidate list in this pass. The jobs of one shape share their
    report's list (``scheduler.explain.finish``), and a list may name every worker: 20,000
    waiting jobs each walking 5,000 candidates was a pass of seconds."""
    if not holds:
        return report
    mine = seen.get(id(report.candidates))
    if mine is None:
        names = set(report.candidates)
        mine = seen[id(report.candidates)] = [h for h in holds if h.worker in names]
    return with_sessions(report, mine, now) if mine else report
