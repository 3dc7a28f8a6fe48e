"""Stage 4a, reports: count why each waiting job waits, per reason code, over every worker.

Runs once at the end of a pass, against its final capacity. One report per distinct (shape,
reservations it may use, reservation it holds); ``plan.py`` copies it per job and ``explain.py``
words it. Each class contributes its static verdict in one step (``static``: the first check that
fails, or "passes"); only passing classes are looked at member by member, and then only the members
with enough free GPUs (a bisect of the class's sorted free counts) or holding reservations, which
at the end of a pass are few. The rest count as ``gpus_busy`` in bulk. Every worker is counted
exactly once, so a report's counts add up to ``workers_total``.
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
class _Static:
    """A shape's static verdicts over every class (reports share them)."""

    counts: dict[Reason, int]
    why: str  # the support matrix's words, when a device kind is unusable
    passing: list[tuple[WorkerClass, Fit, list[int]]]  # classes (and members) that pass
    held: frozenset[str] = frozenset()  # owners of reservations held on passing members


@dataclass(slots=True)
class _Verdicts:
    """What the members of one class say for one report."""

    each: list[tuple[Reason | None, int, int]]  # (reason or None = room, worker, free GPUs)
    busy: int = 0  # further members with too few free GPUs, counted in bulk
    sample: Sequence[tuple[int, int]] = ()  # the best of those, (-free, worker), for candidates


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
        verdicts: Callable[[Shape], tuple[list[Fit], frozenset[int] | None]],
        counts_memo: Memo[tuple[Reason, int, str], ReasonCount] | None = None,
        templates: Memo[tuple[object, ...], Template] | None = None,
    ) -> None:
        self.counts_memo = counts_memo
        self.templates = templates
        self.index = index
        self.classes = classes
        self.workers = workers
        self.reservations = reservations
        self.verdicts = verdicts
        self.states: dict[int, _ClassState] = {}
        self.statics: dict[int, _Static] = {}
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

    def static(self, shape: Shape) -> _Static:
        """The static verdicts for ``shape``, summed per reason, and the classes that pass."""
        st = self.statics.get(shape.uid)
        if st is not None:
            return st
        fits, ok = self.verdicts(shape)
        st = self.statics[shape.uid] = _Static({}, "", [])
        chosen = self.selection(shape.selector, ok) if ok is not None else None
        for cls, fit in zip(self.classes, fits, strict=True):
            members = cls.members
            if chosen is not None and cls.state_reason is None:
                matching = chosen.get(cls.id, [])
                _add(st.counts, Reason.SELECTOR_MISMATCH, len(members) - len(matching))
                members = matching
            if not members:
                continue
            if fit.reason is not None:
                _add(st.counts, fit.reason, len(members))
                if fit.reason is Reason.UNSUPPORTED_VENDOR and not st.why:
                    st.why = cls.profile.unusable_why
                continue
            st.passing.append((cls, fit, members))
            held = self.index.held_by_class.get(cls.id)
            if held:
                subset = set(members)
                st.held = st.held.union(
                    h.owner for i in held if i in subset for h in self.index.holds[i] or ()
                )
        return st

    def report(self, shape: Shape, allowed: frozenset[str], owner: str | None) -> Template:
        """The report template for jobs of ``shape`` and its sentence around the job id."""
        if owner is not None:
            allowed = allowed | {owner}
        static = self.static(shape)
        counts = dict(static.counts)
        dynamic: dict[Reason, int] = {}
        room = 0
        owners: list[str] = []
        ranked: list[tuple[int, int, int]] = []  # (no room, -free GPUs, worker)
        for cls, fit, members in static.passing:
            v = self._verdicts(shape, cls, fit, members, allowed, owners)
            for code, i, free in v.each:
                if code is None:
                    room += 1
                else:
                    _add(dynamic, code, 1)
                ranked.append((0 if code is None else 1, -free, i))
            _add(dynamic, Reason.GPUS_BUSY, v.busy)
            ranked.extend((1, neg, i) for neg, i in v.sample)
        qualifying = room + sum(dynamic.values())
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
            largest_gpus, largest_cpus = self.largest(shape)
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

    def _verdicts(
        self,
        shape: Shape,
        cls: WorkerClass,
        fit: Fit,
        members: list[int],
        allowed: frozenset[str],
        owners: list[str],
    ) -> _Verdicts:
        index = self.index
        need_cpus = shape.cpus
        if fit.cpu_only:
            return _Verdicts(
                [
                    (
                        None
                        if need_cpus is None or index.cpus[i] >= need_cpus
                        else Reason.CPUS_BUSY,
                        i,
                        0,
                    )
                    for i in members
                ]
            )
        st = self.state(cls)
        n = shape.gpus
        subset = None if len(members) == len(cls.members) else set(members)
        verdicts = _Verdicts([])
        if st.mixed:
            near = [i for _, i in st.plain]
        else:
            # Homogeneous: a member without holds has room for n GPUs iff its free count >= n.
            cut = bisect_right(st.neg, -n)
            near = [i for _, i in st.plain[:cut]]
            if subset is None:
                verdicts.busy = len(st.plain) - cut
                verdicts.sample = st.plain[cut : cut + CANDIDATES]
            else:
                far = [x for x in st.plain[cut:] if x[1] in subset]
                verdicts.busy = len(far)
                verdicts.sample = far[:CANDIDATES]
        for i in near + st.held:
            if subset is not None and i not in subset:
                continue
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
                    code = (
                        None
                        if need_cpus is None or index.cpus[i] >= need_cpus
                        else Reason.CPUS_BUSY
                    )
                    break
                if (free & m).bit_count() >= n:
                    code = Reason.RESERVED
                    for h in index.holds[i] or ():
                        if h.mask & blocked & free & m and h.owner not in owners:
                            owners.append(h.owner)
            verdicts.each.append((code, i, best))
        return verdicts


def _add(table: dict[Reason, int], code: Reason, n: int) -> None:
    if n:
        table[code] = table.get(code, 0) + n
