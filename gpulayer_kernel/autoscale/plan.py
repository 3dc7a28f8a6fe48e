"""``plan_scaling(snapshot, offers, budgets) -> ScalingPlan``: pure, deterministic, explainable.

Scale up: the waiting jobs are walked in the scheduler's queue order (priority, then ``seq``,
then id). Each first takes room on a machine already booting for GPUlayer (a *bin*: what its
offer holds, less what earlier jobs of this pass took, tightest fit first); failing that, the
cheapest offer that fits it (price per hour, then boot time, then id) is launched, within its
provider's ``max_instances`` and the offer's ``capacity``, the cluster's ``max_price_per_hour``
and every budget the job spends from, and its bin takes the jobs after it that fit. A job that
nothing can take gets a note saying why, for the cheapest offer that fits it: over budget (with
what is left), over the max price, at the provider's limit, the provider backing off or down,
or no offer fits at all. Capacity and money only shrink during a pass, so a (shape, budgets)
that failed once fails again: such jobs cost one lookup (10,000 jobs x 100 offers: see
``benchmarks/bench_autoscale.py``).

Scale down: a joined instance whose worker has run nothing for ``idle_timeout`` seconds is
terminated; so is a draining one that went idle.

No I/O, no clock (``now`` is in the snapshot), no randomness (backoff jitter is drawn by the
control plane and arrives as ``backoff_until``); ties break on stable keys.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ..contracts import InstanceState, Offer, ScalingCode, ScalingNote
from ..scheduler.feasible import Shape
from .fit import Fits
from .model import Launch, PendingJob, ScalingPlan, ScalingSnapshot, Terminate

_LIVE = (
    InstanceState.REQUESTED,
    InstanceState.BOOTING,
    InstanceState.JOINED,
    InstanceState.DRAINING,
)


@dataclass(slots=True, eq=False)
class _Bin:
    """A machine that is booting (or planned in this pass) and what is still free on it."""

    offer: int
    free: int  # GPUs
    instance: str | None  # None: planned by this pass
    eta: float  # seconds until its worker should join
    seq: int = 0  # order of arrival: ties go to the oldest


class _Room:
    """Bins by free GPU count, then offer, oldest first. Per free count a bit mask says which
    offers have a bin there, so the tightest fit for a job of ``g`` GPUs is a few big-integer
    ANDs with the mask of the offers its shape fits (lowest free count >= g, then lowest offer
    index, then the oldest bin), not a scan of every booting machine."""

    def __init__(self) -> None:
        self.bins: dict[tuple[int, int], dict[int, _Bin]] = {}  # (free, offer) -> bins by seq
        self.level: dict[int, int] = {}  # free -> mask of the offers with a bin at that count
        self.frees: list[int] = []  # the keys of ``level``, ascending
        self._seq = 0

    def add(self, b: _Bin) -> None:
        self._seq += 1
        b.seq = self._seq
        self._put(b)

    def _put(self, b: _Bin) -> None:
        key = (b.free, b.offer)
        bins = self.bins.get(key)
        if bins is None:
            bins = self.bins[key] = {}
            if b.free not in self.level:
                insort(self.frees, b.free)
                self.level[b.free] = 0
            self.level[b.free] |= 1 << b.offer
        bins[b.seq] = b

    def take(self, b: _Bin, gpus: int) -> None:
        key = (b.free, b.offer)
        bins = self.bins[key]
        del bins[b.seq]
        if not bins:
            del self.bins[key]
            self.level[b.free] &= ~(1 << b.offer)
        b.free -= gpus
        self._put(b)

    def pick(self, gpus: int, count: int, offers: int) -> list[_Bin]:
        """Up to ``count`` distinct bins with ``gpus`` free among the offers in mask ``offers``."""
        out: list[_Bin] = []
        for free in self.frees[bisect_left(self.frees, gpus) :]:
            m = self.level[free] & offers
            while m:
                low = m & -m
                for b in self.bins[(free, low.bit_length() - 1)].values():
                    out.append(b)
                    if len(out) == count:
                        return out
                m ^= low
        return out


def plan_scaling(
    snapshot: ScalingSnapshot, offers: Sequence[Offer], budgets: Mapping[str, float]
) -> ScalingPlan:
    """Launches for the waiting jobs, terminations of idle machines, a note per waiting job.

    ``offers``: what the providers can launch now; ``budgets``: dollars each budget has left.
    """
    return _Planner(snapshot, offers, budgets).run()


class _Planner:
    def __init__(
        self, snap: ScalingSnapshot, offers: Sequence[Offer], budgets: Mapping[str, float]
    ) -> None:
        self.snap = snap
        self.now = snap.now
        launchable = list(offers)
        by_id = {o.id: i for i, o in enumerate(launchable)}
        known = list(launchable)
        self.room = _Room()
        self.live: dict[str, int] = {}  # provider -> instances not ended
        self.live_offer: dict[str, int] = {}  # offer id -> instances not ended
        self.hourly = 0.0
        for inst in sorted(snap.instances, key=attrgetter("requested_at", "id")):
            if inst.state not in _LIVE:
                continue
            self.live[inst.provider] = self.live.get(inst.provider, 0) + 1
            self.live_offer[inst.offer.id] = self.live_offer.get(inst.offer.id, 0) + 1
            self.hourly += inst.offer.price_per_hour
            if inst.state in (InstanceState.REQUESTED, InstanceState.BOOTING):
                i = by_id.get(inst.offer.id)
                if i is None:  # launched from an offer its provider no longer lists
                    i = by_id[inst.offer.id] = len(known)
                    known.append(inst.offer)
                eta = max(0.0, inst.requested_at + inst.offer.boot_seconds - self.now)
                self.room.add(_Bin(i, inst.offer.gpus, inst.id, eta))
        self.launchable = len(launchable)
        self.fits = Fits.of_offers(known)
        self.offers = known
        # Cheapest first; boot time, then id break ties.
        self.order = sorted(
            range(self.launchable),
            key=lambda i: (known[i].price_per_hour, known[i].boot_seconds, known[i].id),
        )
        self.left = dict(budgets)
        self.make = _Notes()
        self._candidates: dict[int, list[int]] = {}
        self.launches: list[Launch] = []
        self.planned: dict[str, int] = {}  # provider -> launches this pass
        self.planned_offer: dict[str, int] = {}

    # -- the pass ----------------------------------------------------------------------------

    def run(self) -> ScalingPlan:
        notes: dict[str, ScalingNote] = {}
        failed: dict[tuple[int, tuple[str, ...]], ScalingNote | None] = {}
        queue = sorted(self.snap.pending, key=attrgetter("seq", "id"))
        queue.sort(key=attrgetter("priority"), reverse=True)
        for job in queue:
            shape = self.fits.shape(job.resources)
            key = (shape.uid, job.budgets)
            if key in failed:
                note = failed[key]
            else:
                note, placed = self.place(job, shape)
                if not placed:
                    failed[key] = note
            if note is not None:
                notes[job.id] = note
        return ScalingPlan(tuple(self.launches), self.scale_down(), notes)

    def place(self, job: PendingJob, shape: Shape) -> tuple[ScalingNote | None, bool]:
        """A note for ``job`` and whether capacity was found (booting or launched) for it."""
        taken = self.room.pick(shape.gpus, shape.nodes, self.fits.mask(shape))
        if len(taken) == shape.nodes:
            cost = sum(self.cost(job, shape, b.offer) for b in taken)
            over = self.over_budget(job, cost)
            if over is not None:
                return self.note(ScalingCode.OVER_BUDGET, taken[0].offer, cost, over), False
            self.spend(job, cost)
            for b in taken:
                self.room.take(b, shape.gpus)
            head = self.offers[taken[0].offer]
            booting = [b.instance for b in taken if b.instance is not None]
            return (
                self.make(
                    ScalingCode.BOOTING if booting else ScalingCode.LAUNCHING,
                    offer=head.id,
                    price_per_hour=head.price_per_hour,
                    boot_seconds=max(b.eta for b in taken),
                    instances=sorted(booting),
                    estimate=round(cost, 6),
                ),
                True,
            )
        if self.now - job.submitted_at < self.snap.scale_up_after:
            return None, True  # too young to launch for; not a failure of its shape
        n = shape.nodes - len(taken)
        first: ScalingNote | None = None
        base = sum(self.cost(job, shape, b.offer) for b in taken) if taken else 0.0
        for i in self.candidates(shape):
            if first is not None and self._provider_full(self.offers[i].provider, n):
                continue  # only the cheapest offer's reason is worded: skip the rest fast
            cost = base + n * self.cost(job, shape, i)
            blocked = self.blocked(job, i, n, cost, word=first is None)
            if blocked is None:
                return self.launch(job, shape, i, n, taken, cost), True
            first = first or blocked
        if first is None:
            return self.no_offer(shape), False
        return first, False

    def _provider_full(self, provider: str, n: int) -> bool:
        """Its provider cannot launch ``n`` more now: down, backing off, or at its limit."""
        p = self.snap.providers.get(provider)
        if p is None or p.down is not None:
            return True
        if p.backoff_until is not None and p.backoff_until > self.now:
            return True
        used = self.live.get(provider, 0) + self.planned.get(provider, 0)
        return used + n > p.max_instances

    def candidates(self, shape: Shape) -> list[int]:
        """The launchable offers a job of ``shape`` fits, cheapest first (once per shape)."""
        hit = self._candidates.get(shape.uid)
        if hit is None:
            mask = self.fits.mask(shape)
            hit = self._candidates[shape.uid] = [i for i in self.order if mask >> i & 1]
        return hit

    def cost(self, job: PendingJob, shape: Shape, i: int) -> float:
        """Dollars one node of ``job`` is expected to cost on offer ``i``."""
        return self.offers[i].unit_price * self.fits.units(shape, i) * job.hours

    def over_budget(self, job: PendingJob, cost: float) -> tuple[str, float] | None:
        for name in job.budgets:
            left = self.left.get(name)
            if left is not None and cost > left + 1e-9:
                return name, left
        return None

    def spend(self, job: PendingJob, cost: float) -> None:
        for name in job.budgets:
            if name in self.left:
                self.left[name] -= cost

    def blocked(
        self, job: PendingJob, i: int, n: int, cost: float, *, word: bool = True
    ) -> ScalingNote | None:
        """Why offer ``i`` cannot be launched ``n`` times for ``job`` now; None: it can.
        Without ``word`` the reason is not written out (only the cheapest offer's is shown)."""
        why = self._blocked(job, i, n, cost)
        if why is None:
            return None
        if not word:
            return _BLOCKED
        code, over, extra = why
        return self.note(code, i, cost, over, n=n, **extra)

    def _blocked(
        self, job: PendingJob, i: int, n: int, cost: float
    ) -> tuple[ScalingCode, tuple[str, float] | None, dict[str, Any]] | None:
        o = self.offers[i]
        p = self.snap.providers.get(o.provider)
        if p is None or p.down is not None:
            detail = p.down if p is not None and p.down else "not configured"
            return ScalingCode.PROVIDER_ERROR, None, {"detail": detail}
        if p.backoff_until is not None and p.backoff_until > self.now:
            extra = {
                "detail": p.last_error or "",
                "retry_in": p.backoff_until - self.now,
                "limit": float(p.failures),
            }
            return ScalingCode.PROVIDER_BACKOFF, None, extra
        used = self.live.get(o.provider, 0) + self.planned.get(o.provider, 0)
        if used + n > p.max_instances:
            return ScalingCode.PROVIDER_LIMIT, None, {"limit": float(p.max_instances)}
        if o.capacity is not None:
            used = self.live_offer.get(o.id, 0) + self.planned_offer.get(o.id, 0)
            if used + n > o.capacity:
                extra = {"limit": float(o.capacity), "detail": f"{o.id} is in use"}
                return ScalingCode.PROVIDER_LIMIT, None, extra
        top = self.snap.max_price_per_hour
        if top is not None and self.hourly + n * o.price_per_hour > top + 1e-9:
            extra = {"limit": top, "detail": f"${self.hourly:.2f}/h running"}
            return ScalingCode.MAX_PRICE, None, extra
        over = self.over_budget(job, cost)
        if over is not None:
            return ScalingCode.OVER_BUDGET, over, {}
        return None

    def launch(
        self, job: PendingJob, shape: Shape, i: int, n: int, taken: list[_Bin], cost: float
    ) -> ScalingNote:
        o = self.offers[i]
        self.spend(job, cost)
        for b in taken:
            self.room.take(b, shape.gpus)
        for _ in range(n):
            self.launches.append(Launch(o, (job.id,)))
            self.room.add(_Bin(i, o.gpus - shape.gpus, None, o.boot_seconds))
        self.planned[o.provider] = self.planned.get(o.provider, 0) + n
        self.planned_offer[o.id] = self.planned_offer.get(o.id, 0) + n
        self.hourly += n * o.price_per_hour
        return self.make(
            ScalingCode.LAUNCHING,
            offer=o.id,
            price_per_hour=o.price_per_hour * n,
            boot_seconds=o.boot_seconds,
            machines=n,
            instances=sorted(b.instance for b in taken if b.instance) if taken else (),
            estimate=round(cost, 6),
        )

    def note(
        self,
        code: ScalingCode,
        i: int,
        cost: float,
        over: tuple[str, float] | None = None,
        *,
        n: int = 1,
        detail: str = "",
        retry_in: float | None = None,
        limit: float | None = None,
    ) -> ScalingNote:
        o = self.offers[i]
        return self.make(
            code,
            offer=o.id,
            price_per_hour=o.price_per_hour * n,
            boot_seconds=o.boot_seconds,
            machines=n,
            estimate=round(cost, 6),
            budget=over[0] if over else None,
            budget_left=round(max(0.0, over[1]), 6) if over else None,
            limit=limit,
            retry_in=round(retry_in, 3) if retry_in is not None else None,
            detail=detail,
        )

    def no_offer(self, shape: Shape) -> ScalingNote:
        down = sorted((p.name, p.down) for p in self.snap.providers.values() if p.down)
        if down:  # it may fit what a provider that cannot be read now would offer
            said = "; ".join(f"{name}: {why}" for name, why in down)
            return self.make(ScalingCode.PROVIDER_ERROR, detail=said)
        return self.make(ScalingCode.NO_OFFER, detail=_needs(shape))

    # -- scale down --------------------------------------------------------------------------

    def scale_down(self) -> tuple[Terminate, ...]:
        out = []
        timeout = self.snap.idle_timeout
        for inst in sorted(self.snap.instances, key=attrgetter("id")):
            if inst.idle_since is None:
                continue
            idle = self.now - inst.idle_since
            if inst.state == InstanceState.JOINED and idle >= timeout:
                out.append(Terminate(inst.id, f"idle for {idle:.0f}s (idle_timeout {timeout:g}s)"))
            elif inst.state == InstanceState.DRAINING:
                out.append(Terminate(inst.id, "drained"))
        return tuple(out)


_DEFAULTS = {name: f.default for name, f in ScalingNote.model_fields.items() if name != "code"}
_DEFAULTS["instances"] = []


class _Notes:
    """Notes built without validation (every value here is computed, never user input), and
    shared between jobs that get an equal one (notes are frozen: sharing changes nothing but
    the allocations). ``model_construct`` gets every field: one left to its default_factory
    costs an ``inspect.signature`` call (measured: most of a 10,000-job pass)."""

    def __init__(self) -> None:
        self._made: dict[tuple[object, ...], ScalingNote] = {}

    def __call__(self, code: ScalingCode, **fields: object) -> ScalingNote:
        instances = fields.pop("instances", None) or ()
        assert isinstance(instances, (list, tuple))
        # Call sites pass their fields in one order: equal notes share a key (else, merely
        # less sharing; never a wrong note).
        key = (code, *fields.items(), *instances)
        note = self._made.get(key)
        if note is None:
            values = {**_DEFAULTS, **fields, "instances": list(instances)}
            note = self._made[key] = ScalingNote.model_construct(code=code, **values)
        return note


_BLOCKED = ScalingNote(code=ScalingCode.NO_OFFER)  # "blocked", unworded (see ``blocked``)


def _needs(shape: Shape) -> str:
    """``2 GPUs of kind a100 per node`` for a note that no offer fits."""
    if shape.cpu_job:
        what = "a CPU machine" + (f" with {shape.cpus:g} CPUs" if shape.cpus else "")
    else:
        what = f"{shape.gpus} GPU{'s' if shape.gpus != 1 else ''}"
        if shape.kinds:
            what += " of kind " + " or ".join(shape.kinds)
        if shape.memory_min:
            what += f" with {shape.memory_min >> 30} GiB or more"
    if shape.nodes > 1:
        what += f" on each of {shape.nodes} machines"
    if shape.selector:
        what += " labelled " + ", ".join(f"{k}={v}" for k, v in shape.selector)
    if shape.worker:
        what = f"the worker named {shape.worker}"
    return what
