"""Stage 4, explanation of a placed job: one sentence saying where it went and why there
(STYLE: explaining placement), e.g. ``placed on w1 devices [0,1]: tightest fit, 0 GPUs left
free``. A pass remembers the part after the colon (``placed_why``) per shape and outcome, and
builds each job's from it (``placed_node``, ``placed_where``). The sentences of waiting jobs are
``explain.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .explain import gpu_count, short
from .feasible import Shape


@dataclass(frozen=True, slots=True)
class PlacedNode:
    name: str
    devices: tuple[int, ...]
    left_free: int
    simulated: bool


def placed_sentence(
    shape: Shape,
    nodes: Sequence[PlacedNode],
    *,
    choice: int = 0,
    fallback: bool = False,
    gpu_worker: bool = False,
    own_reservation: bool = False,
    backfill_of: str | None = None,
) -> str:
    """One sentence saying where a job went and why there."""
    why = placed_why(
        shape,
        tuple(n.left_free for n in nodes),
        choice=choice,
        fallback=fallback,
        gpu_worker=gpu_worker,
        own_reservation=own_reservation,
        backfill_of=backfill_of,
    )
    return placed_on(nodes, why)


def placed_on(nodes: Sequence[PlacedNode], why: str) -> str:
    """``placed_sentence`` from its second half, ``placed_why``'s (a pass remembers those: jobs
    of one shape placed alike share it)."""
    gang = len(nodes) > 1
    where = [
        placed_node(node.name, node.devices, node.simulated, rank if gang else None)
        for rank, node in enumerate(nodes)
    ]
    return placed_where(where, why)


def placed_node(name: str, devices: Sequence[int], simulated: bool, rank: int | None) -> str:
    """One node's part of ``placed_sentence`` (``rank``: None when the job has one node)."""
    text = name
    if devices:
        sim = "simulated " if simulated else ""
        text += f" {sim}devices [{','.join(map(str, devices))}]"
    if rank is not None:
        text += f" (node {rank})"
    return text


def placed_where(where: Sequence[str], why: str) -> str:
    """``placed_sentence`` from its nodes' parts (``placed_node``) and ``placed_why``'s."""
    return f"placed on {' and '.join(where)}: {why}"


def placed_why(
    shape: Shape,
    lefts: Sequence[int],
    *,
    choice: int = 0,
    fallback: bool = False,
    gpu_worker: bool = False,
    own_reservation: bool = False,
    backfill_of: str | None = None,
) -> str:
    """Why a job went where it went: the part of ``placed_sentence`` after the colon, from the
    GPUs each node has left free (``lefts``) and what ``placed_sentence`` takes."""
    why: list[str] = []
    if shape.cpu_job:
        why.append(
            "CPU job; no CPU-only worker could take it"
            if gpu_worker
            else "CPU job; CPU-only workers first"
        )
    elif fallback:
        why.append('no GPU could take it now and it asked for fallback=["cpu"], so it runs on CPU')
    else:
        if shape.kinds:
            label = shape.choices[choice].label
            if choice == 0:
                why.append(f"first-choice kind {label}")
            else:
                earlier = " or ".join(c.label for c in shape.choices[:choice])
                why.append(f"kind {label} (choice {choice + 1}; no room on {earlier})")
        if own_reservation:
            why.append("on the GPUs reserved for it")
        if backfill_of is not None:
            why.append(
                f"backfilled onto GPUs reserved for job {short(backfill_of)} "
                "(it ends before they are needed)"
            )
        if len(set(lefts)) == 1:
            left = f"{gpu_count(lefts[0])} left free" + (" on each" if len(lefts) > 1 else "")
        else:
            left = " and ".join(str(x) for x in lefts) + " GPUs left free"
        why.append(f"tightest fit, {left}")
    return ", ".join(why)
