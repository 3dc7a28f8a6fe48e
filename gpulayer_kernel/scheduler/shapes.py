"""What a shape's static checks say in one standing cluster, kept between passes.

Everything here is read from the classes (cluster.py) and the workers' labels alone, never from
free capacity: the verdict per class, the workers a selector matches, the ranking lanes, the order
for CPU placements and the reasons counts reports start from. While the ``SchedulerCache`` hands a
pass the same ``Cluster`` object (reused or patched for what runs on its workers), all of it stays
true, so a pass over a queue whose shapes an earlier pass saw derives none of it again
(``SchedulerCache.shape_info``). A cluster built again, or labels changed on a patched one, makes
every entry stale: entries carry the cluster and its label index they were derived from.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts import Reason
from .feasible import Fit, Shape, WorkerClass
from .rank import Lane


@dataclass(slots=True)
class Static:
    """A shape's static verdicts over every class: read from the standing cluster alone, so
    kept with its ``ShapeInfo`` between passes (below). Never changed once built, but
    for ``largest``, filled in when first needed."""

    counts: dict[Reason, int]
    why: str  # the support matrix's words, when a device kind is unusable
    passing: list[tuple[WorkerClass, Fit, list[int]]]  # classes (and members) that pass
    # Per passing class: its members as a set when a selector narrowed them (None: all).
    subsets: list[frozenset[int] | None]
    largest: tuple[int | None, int | None] | None = None  # Reports.largest, once asked


@dataclass(slots=True, eq=False)
class ShapeInfo:
    """Per-shape facts that depend only on the standing cluster (see the module docstring)."""

    shape: Shape
    fits: list[Fit]  # indexed by class id
    gpu: list[tuple[WorkerClass, Fit]]  # classes with devices for it
    cpu: list[tuple[WorkerClass, Fit]]  # classes that run it without devices
    ok: frozenset[int] | None  # workers whose labels match its selector (None: no selector)
    cpu_order: list[int] | None = None  # workers for a CPU placement, best first (lazy)
    lanes: list[list[Lane]] | None = None  # per kind choice, for rank.gpu_candidates (lazy)
    static: Static | None = None  # reports.py's reasons counts before capacity (lazy)
