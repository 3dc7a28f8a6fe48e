"""Whether a job could run on the worker an offer would start: the scheduler's own checks.

An offer is turned into the ``WorkerCapabilities`` its worker will advertise
(``offer_capabilities``), and that into the scheduler's ``Profile``; a job's ``Resources`` into
its ``Shape``. ``Fits`` then runs ``scheduler.feasible.check`` on the pair, the very function a
scheduling pass uses, once per (shape, offer): so "this would fit if X launched one" can never
disagree with where the job is placed once the worker joins. Labels are the offer's (the worker
is started with them); a job naming a worker never fits an offer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..capabilities.simulated import simulated_capabilities
from ..contracts import Device, HostFacts, Offer, Resources, WorkerCapabilities
from ..scheduler.feasible import (
    Fit,
    Profile,
    Shape,
    WorkerClass,
    check,
    derive_profile,
    gpu_fit,
    gpu_value,
    make_shape,
    shape_value,
)


def offer_capabilities(offer: Offer) -> WorkerCapabilities:
    """What the worker on a machine launched from ``offer`` will advertise."""
    host = HostFacts(cpus=offer.cpus, memory_bytes=offer.memory_bytes)
    if offer.gpus and offer.simulated:
        kind = offer.gpu_kind or "sim"
        if offer.gpu_memory:
            kind += f"-{offer.gpu_memory >> 30}gb"
        return simulated_capabilities(offer.gpus, kind, base=WorkerCapabilities(host=host))
    devices = [
        Device(
            index=i,
            vendor="nvidia",
            name=f"{offer.gpu_kind.upper()} (offer {offer.id})",
            kind=offer.gpu_kind,
            memory_bytes=offer.gpu_memory,
        )
        for i in range(offer.gpus)
    ]
    return WorkerCapabilities(host=host, devices=devices, runtime="cuda" if devices else "cpu")


Template = tuple[WorkerCapabilities, Mapping[str, str]]  # what a worker advertises, its labels


class Fits:
    """Remembers, per shape, which templates a job of that shape runs on: an offer's worker
    (``of_offers``), or a live worker's own.

    Templates the checks cannot tell apart (same devices, host CPUs) form one class, checked
    once per shape: 100 offers at 100 prices are a few dozen distinct machines. Labels are then
    checked per template, only for shapes with a selector. The answer is a bit mask (bit i:
    template i), which the planner ANDs with its own."""

    def __init__(self, templates: Sequence[Template]) -> None:
        self.templates = list(templates)
        keys: dict[tuple[object, ...], WorkerClass] = {}
        self._members: dict[int, int] = {}  # class id -> mask of its templates
        self._classes: list[WorkerClass] = []
        for i, (c, _) in enumerate(templates):
            p = derive_profile(c)
            cls = keys.get((p.key, p.host_cpus))
            if cls is None:
                uid = len(keys)
                cls = keys[(p.key, p.host_cpus)] = _class(uid, derive_profile(c, uid))
                self._classes.append(cls)
            self._members[cls.id] = self._members.get(cls.id, 0) | 1 << i
        self._gpus = [len(c.devices) for c, _ in templates]
        self._shapes: dict[tuple[object, ...], Shape] = {}
        self._gpu_uids: dict[tuple[object, ...], int] = {}
        self._masks: dict[int, int] = {}  # shape uid -> the templates it fits
        # Shapes that differ only in CPUs or a selector share the GPU checks' verdict.
        self._gpu_fits: dict[tuple[int, int], Fit] = {}

    @classmethod
    def of_offers(cls, offers: Sequence[Offer]) -> Fits:
        return cls([(offer_capabilities(o), o.labels) for o in offers])

    def shape(self, r: Resources) -> Shape:
        key = shape_value(r)
        shape = self._shapes.get(key)
        if shape is None:
            g = self._gpu_uids.setdefault(gpu_value(r), len(self._gpu_uids))
            shape = self._shapes[key] = make_shape(r, key, len(self._shapes), g)
        return shape

    def mask(self, shape: Shape) -> int:
        """Every template a job of ``shape`` runs on (one node of it), as a bit mask."""
        hit = self._masks.get(shape.uid)
        if hit is not None:
            return hit
        hit = 0
        if shape.worker is None:  # a job that names a worker waits for that worker
            for cls in self._classes:
                fit = check(shape, cls, self._gpu_fit)
                if fit.reason is None and (fit.cpu_only or any(fit.masks)):
                    hit |= self._members[cls.id]
            if shape.selector:
                for i, (_, labels) in enumerate(self.templates):
                    if hit >> i & 1 and any(labels.get(k) != v for k, v in shape.selector):
                        hit &= ~(1 << i)
        self._masks[shape.uid] = hit
        return hit

    def fits(self, shape: Shape, offer: int) -> bool:
        """One node of ``shape`` runs on a worker of template ``offer``."""
        return bool(self.mask(shape) >> offer & 1)

    def _gpu_fit(self, shape: Shape, profile: Profile) -> Fit:
        key = (shape.gpu_uid, profile.uid)
        hit = self._gpu_fits.get(key)
        if hit is None:
            hit = self._gpu_fits[key] = gpu_fit(shape, profile)
        return hit

    def units(self, shape: Shape, offer: int) -> float:
        """What a job of ``shape`` is charged for per node there: its GPUs, or the whole
        machine when it has none (the ledger's rule)."""
        return float(shape.gpus) if self._gpus[offer] else 1.0


def _class(i: int, profile: Profile) -> WorkerClass:
    return WorkerClass(i, profile, None, profile.host_cpus, None, [i])
