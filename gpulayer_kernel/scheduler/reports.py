"""Stage 4a, reports: count why each waiting job waits, per reason code, over every worker.

Runs once at the end of a pass, against its final capacity. One report per distinct (shape,
reservations it may use, reservation it holds); ``plan.py`` copies it per job and ``explain.py``
words it. Each class contributes its static verdict in one step (``static``: the first check that
fails, or "passes"); only passing classes are looked at member by member, and then only the members
with enough free GPUs (a bisect of the class's sorted free counts) or holding reservations, which
at the end of a pass are few. The rest count as ``gpus_busy`` in bulk. Every worker is counted
exactly once, so a report's counts add up to ``workers_total``.

What members holding no reservation say depends only on the class and what the job asks (GPUs,
CPUs, kind masks): one summary per such key (``_summary``: room, busy counts, best candidates)
serves every report of the pass asking the same, and a shape adds its summaries up once
(``_plain``). Holders are summed per (class, ask, reservations usable) (``_held``). The static
part (``Static``) is kept with the shape's ``ShapeInfo`` between passes (shapes.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..contracts import PlacementReport, Reason, ReasonCount
from .explain import make_report, sentence_parts
from .feasible import Fit, Shape, WorkerClass, suitable_count
from .memo import Memo
from .model import Reservation, WorkerView
from .rank import Index
from .shapes import ShapeInfo, Static

CANDIDATES = 3  # workers named in a report as able to take the job once capacity frees
# A report without its job (``job_id`` empty) and its sentence split around the job id.
Template = tuple[PlacementReport, tuple[str, str]]


@dataclass(slots=True)
class _ClassState:
    """A class's members at the end of the pass, summarised for reports."""

    plain: list[tuple[int, int]]  # (-free count, worker) of members without holds, ascending
    neg: list[int]  # the -free counts of ``plain``, for bisect
    held: list[int]  # members holding reservations
    mixed: bool  # devices differ: read each member's free mask


@dataclass(slots=True)
class _Summary:
    """What the members of one class that hold no reservation say, at the end of a pass, for
    one (GPUs, CPUs, kind masks): no reservation is in their way, so every report of every shape
    asking the same shares it, whatever reservations it may use."""

    room: int
    gpus_busy: int
    cpus_busy: int
    best: list[tuple[int, int, int]]  # the best CANDIDATES (no room, -free GPUs, worker), sorted
    reserved: int = 0  # members whose free GPUs are reserved for others (holders only)
    owners: tuple[str, ...] = ()  # those reservations' owners, in the order met (holders only)


class Reports:
    """Builds one report per distinct (shape, usable reservations, owner) at the pass's end.

    Each class contributes its static verdict in one step; only classes that pass are looked at
    member by member, and then only the members with enough free GPUs (a bisect of the class's
    free counts) or holding reservations, which at the end of a pass are few. The rest count as
    ``gpus_busy`` in bulk.
    """

    def __init__(
        self,
        index: Index,
        classes: Sequence[WorkerClass],
        workers: Sequence[WorkerView],
        reservations: Mapping[str, Reservation],
        info: Callable[[Shape], ShapeInfo],
        counts_memo: Memo[tuple[Reason, int, str], ReasonCount] | None = None,
        templates: Memo[tuple[object, ...], Template] | None = None,
    ) -> None:
        self.counts_memo = counts_memo
        self.templates = templates
        self.index = index
        self.classes = classes
        self.workers = workers
        self.reservations = reservations
        self.info = info
        self.states: dict[int, _ClassState] = {}
        self.held: dict[int, frozenset[str]] = {}
        self.summaries: dict[tuple[object, ...], _Summary] = {}  # per class (_summary)
        self.plain: dict[int, _Summary] = {}  # per shape: its summaries added up (_plain)
        # Per shape: its passing classes with members holding reservations; and what those
        # members say, per class and the reservations a report may use (_held).
        self.held_lanes: dict[int, list[tuple[WorkerClass, Fit, frozenset[int] | None]]] = {}
        self.held_summaries: dict[tuple[object, ...], _Summary] = {}
        self.selections: dict[tuple[tuple[str, str], ...], dict[int, list[int]]] = {}

    def state(self, cls: WorkerClass) -> _ClassState:
        st = self.states.get(cls.id)
        if st is None:
            index = self.index
            plain = sorted((-index.count[i], i) for i in cls.members if index.holds[i] is None)
            held = [i for i in cls.members if index.holds[i] is not None]
            st = _ClassState(plain, [c for c, _ in plain], held, not cls.profile.homogeneous)
            self.states[cls.id] = st
        return st

    def selection(
        self, selector: tuple[tuple[str, str], ...], ok: frozenset[int]
    ) -> dict[int, list[int]]:
        """The workers a selector matches, per class (ascending): one walk over the matches."""
        hit = self.selections.get(selector)
        if hit is None:
            hit = self.selections[selector] = {}
            class_of = self.index.class_of
            for i in sorted(ok):
                hit.setdefault(class_of[i].id, []).append(i)
        return hit

    def static(self, shape: Shape) -> Static:
        """The static verdicts for ``shape``, summed per reason, and the classes that pass."""
        info = self.info(shape)
        st = info.static
        if st is not None:
            return st
        fits, ok = info.fits, info.ok
        st = Static({}, "", [], [])
        chosen = self.selection(shape.selector, ok) if ok is not None else None
        for cls, fit in zip(self.classes, fits, strict=True):
            members = cls.members
            subset = None
            if chosen is not None and cls.state_reason is None:
                matching = chosen.get(cls.id, [])
                _add(st.counts, Reason.SELECTOR_MISMATCH, len(members) - len(matching))
                if len(matching) != len(members):
                    subset = frozenset(matching)
                members = matching
            if not members:
                continue
            if fit.reason is not None:
                _add(st.counts, fit.reason, len(members))
                if fit.reason is Reason.UNSUPPORTED_VENDOR and not st.why:
                    st.why = cls.profile.unusable_why
                continue
            st.passing.append((cls, fit, members))
            st.subsets.append(subset)
        info.static = st
        return st

    def held_owners(self, shape: Shape) -> frozenset[str]:
        """Owners of the reservations held on workers that pass ``shape``'s static checks."""
        hit = self.held.get(shape.uid)
        if hit is None:
            hit = frozenset()
            held_by_class = self.index.held_by_class
            if held_by_class:
                holds = self.index.holds
                for cls, _fit, members in self.static(shape).passing:
                    held = held_by_class.get(cls.id)
                    if held:
                        subset = set(members)
                        hit = hit.union(
                            h.owner for i in held if i in subset for h in holds[i] or ()
                        )
            self.held[shape.uid] = hit
        return hit

    def report(self, shape: Shape, allowed: frozenset[str], owner: str | None) -> Template:
        """The report template for jobs of ``shape`` and its sentence around the job id."""
        if owner is not None:
            allowed = allowed | {owner}
        static = self.static(shape)
        counts = dict(static.counts)
        index = self.index
        held_by_class = index.held_by_class
        n = shape.gpus
        need = shape.cpus
        # Members holding no reservation: one summary per shape, added up from one per class
        # that every shape asking the same shares (_plain). Members holding one: per class and
        # the reservations this report may use (_held), in class order, as the owners in its
        # way are named in the order they are met.
        plain = self.plain.get(shape.uid)
        if plain is None:
            plain = self.plain[shape.uid] = self._plain(static, n, need)
        room, gpus_busy, cpus_busy = plain.room, plain.gpus_busy, plain.cpus_busy
        reserved = 0
        owners: list[str] = []
        ranked = list(plain.best)  # (no room, -free GPUs, worker)
        lanes = self.held_lanes.get(shape.uid)
        if lanes is None:
            lanes = self.held_lanes[shape.uid] = [
                (cls, fit, subset)
                for (cls, fit, _members), subset in zip(static.passing, static.subsets, strict=True)
                if not fit.cpu_only and cls.id in held_by_class
            ]
        for cls, fit, subset in lanes:
            at = (cls.id, fit.masks, n, need, subset, allowed)
            holders = self.held_summaries.get(at)
            if holders is None:
                holders = self.held_summaries[at] = self._held(cls, fit, subset, n, need, allowed)
            room += holders.room
            gpus_busy += holders.gpus_busy
            cpus_busy += holders.cpus_busy
            reserved += holders.reserved
            ranked.extend(holders.best)
            for o in holders.owners:
                if o not in owners:
                    owners.append(o)
        dynamic: dict[Reason, int] = {}
        _add(dynamic, Reason.GPUS_BUSY, gpus_busy)
        _add(dynamic, Reason.CPUS_BUSY, cpus_busy)
        _add(dynamic, Reason.RESERVED, reserved)
        qualifying = room + gpus_busy + cpus_busy + reserved
        if shape.nodes > 1 and qualifying < shape.nodes:
            _add(counts, Reason.TOO_FEW_NODES, qualifying)
            room = 0  # too few to run it at all: none of them "can run" it (issue 12, item 16)
        else:
            for code, n in dynamic.items():
                _add(counts, code, n)
            if shape.nodes > 1:
                _add(counts, Reason.NOT_ENOUGH_NODES, room)
        ranked.sort()
        reservation = self.reservations.get(owner) if owner else None
        largest_gpus = largest_cpus = None
        if room == 0 and not dynamic:
            # Nothing could take it, busy or not: say what exists (rare; one walk of profiles).
            if static.largest is None:
                static.largest = self.largest(shape)  # the profiles alone: kept with static
            largest_gpus, largest_cpus = static.largest
        # Everything make_report reads: equal keys give equal templates, so one built by an
        # earlier pass serves (the cluster rarely changes much between two passes).
        held = tuple(sorted(reservation.devices)) if reservation else ()
        candidates = tuple(self.workers[i].name for _, _, i in ranked[:CANDIDATES])
        total = len(self.workers)
        key = (
            shape.key,
            room,
            tuple(counts.items()),
            tuple(owners),
            static.why,
            held,
            candidates,
            largest_gpus,
            largest_cpus,
            total,
        )
        memo = self.templates
        hit = memo.get(key) if memo is not None else None
        if hit is None:
            template = make_report(
                shape,
                counts,
                total=total,
                feasible=room,
                owners=owners,
                why=static.why,
                reservation=held,
                candidates=candidates,
                counts_memo=self.counts_memo,
                largest_gpus=largest_gpus,
                largest_cpus=largest_cpus,
            )
            hit = (template, sentence_parts(template))
            if memo is not None:
                memo.put(key, hit)
        return hit

    def largest(self, shape: Shape) -> tuple[int | None, int | None]:
        """The most suitable GPUs and the most CPUs on any one worker, whatever its state."""
        gpus = cpus = None
        if not shape.cpu_job:
            seen: dict[int, int] = {}
            for p in self.index.profiles:
                if p.uid not in seen:
                    seen[p.uid] = suitable_count(shape, p)
            gpus = max(seen.values(), default=0)
        if shape.cpus is not None:
            cpus = max((p.host_cpus for p in self.index.profiles), default=0)
        return gpus, cpus

    def _plain(self, static: Static, n: int, need: float | None) -> _Summary:
        """Every passing member holding no reservation, for a shape of ``n`` GPUs and ``need``
        CPUs: the class summaries added up (the best candidates of each kept)."""
        room = gpus_busy = cpus_busy = 0
        best: list[tuple[int, int, int]] = []
        for (cls, fit, members), subset in zip(static.passing, static.subsets, strict=True):
            key = (cls.id, fit.masks, fit.cpu_only, n, need, subset)
            summary = self.summaries.get(key)
            if summary is None:
                summary = self.summaries[key] = self._summary(cls, fit, members, subset, n, need)
            room += summary.room
            gpus_busy += summary.gpus_busy
            cpus_busy += summary.cpus_busy
            best.extend(summary.best)
        best.sort()
        return _Summary(room, gpus_busy, cpus_busy, best[:CANDIDATES])

    def _summary(
        self,
        cls: WorkerClass,
        fit: Fit,
        members: list[int],
        subset: frozenset[int] | None,
        n: int,
        need: float | None,
    ) -> _Summary:
        """``members`` of ``cls`` holding no reservation, at the end of the pass, for a job of
        ``n`` GPUs and ``need`` CPUs whose static verdict on the class is ``fit``."""
        index = self.index
        cpus = index.cpus
        room = gpus_busy = cpus_busy = 0
        ranked: list[tuple[int, int, int]] = []
        if fit.cpu_only:
            # Held devices do not stop a job that takes none: every member counts here.
            for i in members:
                if need is None or cpus[i] >= need:
                    room += 1
                    ranked.append((0, 0, i))
                else:
                    cpus_busy += 1
                    ranked.append((1, 0, i))
            ranked.sort()
            return _Summary(room, 0, cpus_busy, ranked[:CANDIDATES])
        st = self.state(cls)
        if st.mixed:
            near = [i for _, i in st.plain]
            cut = len(st.plain)
        else:
            # Homogeneous: a member without holds has room for n GPUs iff its free count >= n.
            cut = bisect_right(st.neg, -n)
            near = [i for _, i in st.plain[:cut]]
        if subset is None:
            gpus_busy = len(st.plain) - cut
            far: Sequence[tuple[int, int]] = st.plain[cut : cut + CANDIDATES]
        else:
            near = [i for i in near if i in subset]
            far = [x for x in st.plain[cut:] if x[1] in subset]
            gpus_busy = len(far)
        ranked.extend((1, neg, i) for neg, i in far[:CANDIDATES])
        free_of = index.free
        for i in near:
            free = free_of[i]
            best = 0
            fits_here = False
            for m in fit.masks:
                if not m:
                    continue
                have = (free & m).bit_count()
                best = max(best, have)
                if have >= n:
                    fits_here = True
                    break
            if not fits_here:
                gpus_busy += 1
                ranked.append((1, -best, i))
            elif need is None or cpus[i] >= need:
                room += 1
                ranked.append((0, -best, i))
            else:
                cpus_busy += 1
                ranked.append((1, -best, i))
        ranked.sort()
        return _Summary(room, gpus_busy, cpus_busy, ranked[:CANDIDATES])

    def _held(
        self,
        cls: WorkerClass,
        fit: Fit,
        subset: frozenset[int] | None,
        n: int,
        need: float | None,
        allowed: frozenset[str],
    ) -> _Summary:
        """The members of ``cls`` holding reservations, for a job that may use ``allowed``'s."""
        room = gpus_busy = cpus_busy = reserved = 0
        owners: list[str] = []
        ranked: list[tuple[int, int, int]] = []
        for i in self.state(cls).held:
            if subset is not None and i not in subset:
                continue
            code, best = self._held_verdict(i, fit, n, need, allowed, owners)
            if code is None:
                room += 1
            elif code is Reason.GPUS_BUSY:
                gpus_busy += 1
            elif code is Reason.CPUS_BUSY:
                cpus_busy += 1
            else:
                reserved += 1
            ranked.append((0 if code is None else 1, -best, i))
        ranked.sort()
        return _Summary(room, gpus_busy, cpus_busy, ranked[:CANDIDATES], reserved, tuple(owners))

    def _held_verdict(
        self,
        i: int,
        fit: Fit,
        n: int,
        need: float | None,
        allowed: frozenset[str],
        owners: list[str],
    ) -> tuple[Reason | None, int]:
        """What worker ``i``, holding a reservation, says to a job that may use ``allowed``'s
        (None: room), and its most usable free GPUs; adds the owners in its way to ``owners``."""
        index = self.index
        blocked, _usable, _via = index.blocked(i, allowed)
        free = index.free[i]
        best = 0
        code: Reason | None = Reason.GPUS_BUSY
        for m in fit.masks:
            if not m:
                continue
            have = (free & m & ~blocked).bit_count()
            best = max(best, have)
            if have >= n:
                code = None if need is None or index.cpus[i] >= need else Reason.CPUS_BUSY
                break
            if (free & m).bit_count() >= n:
                code = Reason.RESERVED
                for h in index.holds[i] or ():
                    if h.mask & blocked & free & m and h.owner not in owners:
                        owners.append(h.owner)
        return code, best


def _add(table: dict[Reason, int], code: Reason, n: int) -> None:
    if n:
        table[code] = table.get(code, 0) + n
