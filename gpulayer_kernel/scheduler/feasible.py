"""Stage 1, feasibility: which workers could *ever* run a job, and the first check each one fails.

Words (see README.md): a **profile** is what one ``WorkerCapabilities`` means to the scheduler
(usable devices as a bit mask, their kinds and memory, the support-matrix verdict); a **class** is a
set of workers that the checks below cannot tell apart (same profile, a state that takes work, the
same answer to every CPU count asked for, and, only when a job names it, the same name; workers
that take no work form one class per state); a **shape** is what a job asks for, without its
identity. Feasibility is a pure function of (shape, class), computed once per pair, and its GPU part
once per (GPU request, profile): 10,000 jobs of a few hundred shapes against 1,000 workers in a few
dozen classes cost thousands of cheap lookups, not ten million checks. Labels are the exception:
they are checked per worker (``selector`` is rare, and a label such as a hostname would otherwise
split every worker into its own class).

Checks run cheapest first, in this documented order, and the first failure is the reason:

1. state            READY/BUSY take work (unless held back: suspect, set aside as
                    unschedulable); CORDONED, DRAINING, anything else do not
2. labels, name     ``selector`` must match (per worker); ``worker`` must be this worker's name
3. GPUs and kind    a GPU job needs accelerators (or asked ``fallback=["cpu"]`` and this worker has
                    none); one of them must be of a kind the job accepts
4. support matrix   the device must be usable (AMD needs torch ROCm, Apple needs torch MPS) and the
                    job allowed on it (no distributed work on MPS)
5. count, memory    enough usable devices of that kind with enough memory; ``cpus`` <= host CPUs
6. (dynamic, rank.py/plan.py) free GPUs and CPUs now, then reservations
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..capabilities.kinds import parse_kind
from ..capabilities.support import WorkerSupport, job_refusal, worker_support
from ..contracts import Reason, Resources, WorkerCapabilities, WorkerState

TAKES_WORK = frozenset({WorkerState.READY, WorkerState.BUSY})

# ------------------------------------------------------------------------------------------------
# profiles


@dataclass(frozen=True, slots=True, eq=False)
class Profile:
    """What one ``WorkerCapabilities`` means to the scheduler; derived once per object while a
    ``SchedulerCache`` remembers it."""

    key: tuple[object, ...]  # equal keys: indistinguishable to every check
    uid: int  # a small int per distinct key, so hot paths hash an int, not a nested tuple
    usable_mask: int  # bit i set: device index i is usable
    usable_count: int
    kinds: Mapping[int, str]  # usable device index -> kind
    memory: Mapping[int, int]  # usable device index -> bytes
    reported_kinds: frozenset[str]  # kinds of every accelerator reported, usable or not
    reported: int  # accelerators reported (vendor "cpu" entries excluded)
    sim_mask: int  # simulated devices among the usable ones
    unusable_why: str  # why reported devices are not usable ("AMD GPU without ...")
    support: WorkerSupport
    host_cpus: int
    homogeneous: bool  # every usable device has the same kind and memory

    @property
    def simulated(self) -> bool:
        return self.sim_mask != 0


def derive_profile(caps: WorkerCapabilities, uid: int = 0) -> Profile:
    """The scheduler's view of ``caps``, numbered ``uid``. Not cached here: profiles with equal
    ``key`` must share one uid within a pass, which ``SchedulerCache.profile`` sees to."""
    support = worker_support(caps)
    kinds = {d.index: d.kind for d in support.usable}
    memory = {d.index: d.memory_bytes for d in support.usable}
    usable_mask = 0
    sim_mask = 0
    for d in support.usable:
        usable_mask |= 1 << d.index
        if d.vendor == "sim":
            sim_mask |= 1 << d.index
    reported_kinds = frozenset(
        [d.kind for d in support.usable] + [u.device.kind for u in support.unusable]
    )
    if any(d.vendor == "sim" for d in support.usable):
        reported_kinds |= {"sim"}
    layout = tuple(sorted((d.index, d.kind, d.memory_bytes, d.vendor) for d in support.usable))
    unusable = tuple(sorted((u.device.index, u.device.kind, u.why) for u in support.unusable))
    return Profile(
        key=(layout, unusable, support.single_device_only),
        uid=uid,
        usable_mask=usable_mask,
        usable_count=len(support.usable),
        kinds=kinds,
        memory=memory,
        reported_kinds=reported_kinds,
        reported=support.reported,
        sim_mask=sim_mask,
        unusable_why=support.unusable[0].why if support.unusable else "",
        support=support,
        host_cpus=caps.host.cpus,
        homogeneous=len({(k, memory[i]) for i, k in kinds.items()}) <= 1,
    )


# ------------------------------------------------------------------------------------------------
# shapes


@dataclass(frozen=True, slots=True)
class KindChoice:
    """One acceptable GPU kind in the job's preference order (``kind=None``: any kind)."""

    kind: str | None
    memory_min: int  # bytes per GPU: the job's gpu_memory_min or the kind's suffix ("a100-80gb")
    label: str  # as the user wrote it, for sentences


@dataclass(frozen=True, slots=True, eq=False)
class Shape:
    """What a job asks for, without its identity: jobs of one shape are interchangeable."""

    key: tuple[object, ...]
    uid: int  # the cache's number for ``key`` (hot paths hash it, not ``key``)
    gpu_uid: int  # numbers the distinct GPU requests (``gpu_key``) of one pass
    gpus: int  # per node
    nodes: int
    choices: tuple[KindChoice, ...]
    memory_min: int | None
    cpus: float | None
    fallback: bool
    selector: tuple[tuple[str, str], ...]
    worker: str | None
    # Fields, not properties: the pass reads them once per job (10,000 times in a big pass).
    cpu_job: bool  # asks for no GPU
    gang: bool  # more than one rank: all devices at once or none

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(c.label for c in self.choices if c.kind is not None)


def shape_value(r: Resources) -> tuple[object, ...]:
    """Everything in ``Resources`` that placement reads, as a hashable tuple: jobs with equal
    tuples are one shape (``SchedulerCache.shape_key`` numbers them)."""
    return (
        r.gpus,
        tuple(r.gpu_kind),
        r.gpu_memory_min,
        r.cpus,
        r.nodes,
        bool(r.fallback),
        tuple(sorted(r.selector.items())) if r.selector else (),
        r.worker,
    )


def make_shape(
    r: Resources, key: tuple[object, ...] | None = None, uid: int = 0, gpu_uid: int = 0
) -> Shape:
    base_memory = r.gpu_memory_min or 0
    choices: list[KindChoice] = []
    seen: set[tuple[str, int]] = set()
    for written in r.gpu_kind:
        kind, suffix_memory = parse_kind(written)
        memory = max(base_memory, suffix_memory or 0)
        if (kind, memory) not in seen:
            seen.add((kind, memory))
            choices.append(KindChoice(kind, memory, written))
    if not choices:
        choices.append(KindChoice(None, base_memory, "any"))
    return Shape(
        key=key if key is not None else shape_value(r),
        uid=uid,
        gpu_uid=gpu_uid,
        gpus=r.gpus,
        nodes=r.nodes,
        choices=tuple(choices),
        memory_min=r.gpu_memory_min,
        cpus=r.cpus,
        fallback=bool(r.fallback),
        selector=tuple(sorted(r.selector.items())),
        worker=r.worker,
        cpu_job=r.gpus == 0,
        gang=r.gpus > 1 or r.nodes > 1,
    )


# ------------------------------------------------------------------------------------------------
# classes


@dataclass(slots=True, eq=False)
class WorkerClass:
    """Workers that every static check treats alike; ``members`` are worker indices, ascending."""

    id: int
    profile: Profile
    state_reason: Reason | None  # set when the state takes no work: the whole class fails there
    host_cpus: int  # a member's; all members answer every requested CPU count alike
    name: str | None  # only when some pending job asks for this worker by name
    members: list[int]


def state_reason(state: WorkerState, hold: Reason | None = None) -> Reason | None:
    """Why a worker in ``state`` (held back for ``hold``, if set) takes no work; None: it does."""
    if state in TAKES_WORK:
        return hold
    if state == WorkerState.CORDONED:
        return Reason.CORDONED
    if state == WorkerState.DRAINING:
        return Reason.DRAINING
    return Reason.WORKER_NOT_READY


def class_key(
    profile: Profile,
    state: WorkerState,
    host_cpus: int,
    name: str,
    cpu_asks: Sequence[float],
    names: frozenset[str],
    hold: Reason | None = None,
) -> tuple[object, ...]:
    """Workers with equal keys are one class. ``cpu_asks`` are the distinct ``cpus`` values the
    queue asks for, ascending: what matters is how many of them the host can hold. A held-back
    worker (suspect, set aside) takes no work, like one whose state takes none. READY and BUSY
    are one class: no check tells them apart, and a worker flips between them with every job it
    starts or ends (keeping them together lets ``cluster.standing`` patch such a worker)."""
    if state not in TAKES_WORK:
        return ("down", state)
    if hold is not None:
        return ("held", hold)
    return (profile.uid, bisect_right(cpu_asks, host_cpus), name if name in names else None)


def same_class_state(
    a_state: WorkerState, a_hold: Reason | None, b_state: WorkerState, b_hold: Reason | None
) -> bool:
    """Whether two (state, hold) pairs put a worker in the same class, all else equal."""
    a_down, b_down = a_state not in TAKES_WORK, b_state not in TAKES_WORK
    if a_down or b_down:
        return a_state is b_state
    return a_hold is b_hold


def label_index(labels: Sequence[Mapping[str, str]]) -> dict[tuple[str, str], set[int]]:
    """(key, value) -> indices of the workers carrying that label."""
    index: dict[tuple[str, str], set[int]] = {}
    for i, worker_labels in enumerate(labels):
        for item in worker_labels.items():
            index.setdefault(item, set()).add(i)
    return index


def selected(
    selector: tuple[tuple[str, str], ...], index: Mapping[tuple[str, str], set[int]]
) -> frozenset[int]:
    """Indices of the workers whose labels match every pair of ``selector``."""
    result: set[int] | None = None
    for item in selector:
        have = index.get(item, set())
        result = set(have) if result is None else result & have
        if not result:
            return frozenset()
    return frozenset(result or ())


# ------------------------------------------------------------------------------------------------
# the checks


@dataclass(frozen=True, slots=True)
class Fit:
    """The verdict of the static checks for one (shape, class)."""

    reason: Reason | None  # the first check that failed; None when the class can run the shape
    masks: tuple[int, ...] = ()  # per choice: usable devices of that kind and memory; 0 = no room
    cpu_only: bool = False  # runs without devices: a CPU job, or a GPU job's CPU fallback
    fallback: bool = False  # a GPU job taking its CPU fallback (this worker has no usable GPU)


_FITS = {code: Fit(code) for code in Reason}
CPU_FIT = Fit(None, cpu_only=True)
FALLBACK_FIT = Fit(None, cpu_only=True, fallback=True)


def gpu_value(r: Resources) -> tuple[object, ...]:
    """The part of a request the GPU checks read: requests with equal tuples get the same GPU
    verdict on a profile (``SchedulerCache.gpu_fit`` keeps verdicts per (this, profile))."""
    return (r.gpus, r.nodes, tuple(r.gpu_kind), r.gpu_memory_min, bool(r.fallback))


def _kind_matches(choice: KindChoice, kind: str, simulated: bool) -> bool:
    if choice.kind is None:
        return True
    return choice.kind == kind or (choice.kind == "sim" and simulated)


def gpu_fit(shape: Shape, p: Profile) -> Fit:
    """Checks 3-5 for a GPU job (kind, support matrix, count and memory) on one profile."""
    if p.usable_count == 0 and shape.fallback:
        return FALLBACK_FIT
    if p.reported == 0:
        return _FITS[Reason.NO_GPUS]
    kinded = [c for c in shape.choices if c.kind is not None]
    if kinded and not any(
        c.kind in p.reported_kinds or (c.kind == "sim" and p.simulated) for c in kinded
    ):
        return _FITS[Reason.GPU_KIND]
    refusal = job_refusal(p.support, shape.gpus, shape.nodes)
    if refusal is not None:
        return _FITS[refusal[0]]
    sim = p.sim_mask
    kind_mask = 0
    for index, kind in p.kinds.items():
        if any(_kind_matches(c, kind, bool(sim >> index & 1)) for c in shape.choices):
            kind_mask |= 1 << index
    if kind_mask == 0:
        return _FITS[Reason.UNSUPPORTED_VENDOR]
    masks: list[int] = []
    any_memory = False
    for c in shape.choices:
        m = 0
        for index, kind in p.kinds.items():
            if _kind_matches(c, kind, bool(sim >> index & 1)) and p.memory[index] >= c.memory_min:
                m |= 1 << index
        any_memory = any_memory or m != 0
        masks.append(m if m.bit_count() >= shape.gpus else 0)
    if not any_memory:
        return _FITS[Reason.GPU_MEMORY]
    if not any(masks):
        return _FITS[Reason.TOO_FEW_GPUS_TOTAL]
    return Fit(None, masks=tuple(masks))


def suitable_count(shape: Shape, p: Profile) -> int:
    """The most usable devices on ``p`` that one kind choice of ``shape`` accepts (kind and
    memory): what a worker has, to say so when a job can never fit anywhere."""
    sim = p.sim_mask
    best = 0
    for c in shape.choices:
        n = sum(
            1
            for index, kind in p.kinds.items()
            if _kind_matches(c, kind, bool(sim >> index & 1)) and p.memory[index] >= c.memory_min
        )
        best = max(best, n)
    return best


def check(shape: Shape, cls: WorkerClass, gpu: Callable[[Shape, Profile], Fit] = gpu_fit) -> Fit:
    """Run the static checks, cheapest first (see the module docstring for the order). Labels are
    not checked here but per worker, between state and the rest (``selected``). ``gpu`` gives
    checks 3-5 (``SchedulerCache.gpu_fit`` remembers them across passes)."""
    if cls.state_reason is not None:
        return _FITS[cls.state_reason]
    if shape.worker is not None and cls.name != shape.worker:
        return _FITS[Reason.NAME_MISMATCH]
    if shape.cpu_job:
        fit = CPU_FIT
    else:
        fit = gpu(shape, cls.profile)
        if fit.reason is not None:
            return fit
    if shape.cpus is not None and shape.cpus > cls.host_cpus:
        return _FITS[Reason.CPUS_TOTAL]
    return fit
