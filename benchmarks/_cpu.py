"""CPU time per process tree, the measure a loaded machine does not bend (issue 25).

Wall time on a shared 2-core machine moves with whatever else runs; the CPU a process itself
spent does not. A tree's CPU is, for each process alive in it now, its own user + system time
plus that of the children it has already reaped (``cutime``/``cstime``): so a job process that
ran and was waited for by the worker (or its zygote) still counts, once.

    meter = TreeCpu({"server": server.pid, "worker": worker.pid})
    before = meter.sample()
    ...  # N jobs
    after = meter.sample()
    per_job = {name: (after[name] - before[name]) / N for name in after}

Processes re-parented to init (a double fork) are not seen; GPUlayer's job processes, Ray's
workers and ipyparallel's engines all stay under their parent.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable, Mapping
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, own + reaped children's CPU seconds) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the ")" closing the command: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
    return int(fields[1]), sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                kids.setdefault(got[0], []).append(int(entry.name))
    return kids


def tree_cpu_seconds(root: int, kids: Mapping[int, list[int]] | None = None) -> float:
    """CPU seconds of ``root`` and every live descendant, with what each has reaped."""
    kids = _children() if kids is None else kids
    total, todo, seen = 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        got = _stat(pid)
        if got is not None:
            total += got[1]
        todo.extend(kids.get(pid, ()))
    return total


def self_cpu_seconds() -> float:
    """This process's own CPU (its threads included), not its children's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class TreeCpu:
    """Named process trees sampled together; ``"self"`` is this process without its children."""

    def __init__(self, roots: Mapping[str, int]) -> None:
        self.roots = dict(roots)

    def sample(self) -> dict[str, float]:
        kids = _children()
        out = {name: tree_cpu_seconds(pid, kids) for name, pid in self.roots.items()}
        out["self"] = self_cpu_seconds()
        return out

    @staticmethod
    def per_unit(
        before: Mapping[str, float], after: Mapping[str, float], units: int
    ) -> dict[str, float]:
        """CPU milliseconds per unit of work, per name, and their ``total``."""
        per = {name: 1000.0 * (after[name] - before[name]) / max(units, 1) for name in after}
        per["total"] = sum(per.values())
        return per


def describe_cpu(per: Mapping[str, float]) -> str:
    """e.g. ``server 0.61 + worker 1.20 + self 0.30 = 2.11 ms CPU``."""
    parts = [f"{name} {ms:.2f}" for name, ms in per.items() if name != "total"]
    return " + ".join(parts) + f" = {per.get('total', sum(per.values())):.2f} ms CPU"


def children_of(pid: int) -> set[int]:
    """The live direct children of ``pid`` (to tell which processes a library just started)."""
    return set(_children().get(pid, ()))


class BlockCpu:
    """CPU per call of each way, summed over blocks of its calls (interleaved rounds).

    ``at = meter.before(roots)``, the calls, ``meter.after(way, roots, at, calls)``: this
    process's CPU and that of the trees under ``roots`` during the block, charged to ``way``.
    This process is read last before the block and first after it, so the ``/proc`` scans are
    not charged. Read around blocks, not single calls: ``/proc`` counts in 10 ms ticks.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def before(self, roots: Mapping[str, int], alone: Iterable[int] = ()) -> tuple[float, float]:
        """``alone``: processes counted without their children (a kernel that also started
        an anchor's engines: those are another way's)."""
        trees = self._read(roots, alone)
        return trees, self_cpu_seconds()

    def after(
        self,
        way: str,
        roots: Mapping[str, int],
        at: tuple[float, float],
        calls: int = 1,
        alone: Iterable[int] = (),
    ) -> None:
        me = self_cpu_seconds()
        trees = self._read(roots, alone)
        self.seconds[way] = self.seconds.get(way, 0.0) + (trees - at[0]) + (me - at[1])
        self.calls[way] = self.calls.get(way, 0) + calls

    @staticmethod
    def _read(roots: Mapping[str, int], alone: Iterable[int]) -> float:
        kids = _children()
        trees = sum(tree_cpu_seconds(pid, kids) for pid in roots.values())
        return trees + sum((_stat(pid) or (0, 0.0))[1] for pid in alone)

    def per_call_ms(self, way: str) -> float:
        return 1000.0 * self.seconds.get(way, 0.0) / max(self.calls.get(way, 0), 1)


def wait_quiet(
    roots: Mapping[str, int], *, share: float = 0.05, window: float = 0.5, timeout: float = 30.0
) -> float:
    """Wait until the trees under ``roots`` use under ``share`` of a core over ``window``
    seconds (a worker's zygote importing torch in the background would otherwise take the
    measured rounds' CPU): seconds waited, ``timeout`` at most."""
    import time

    start = time.monotonic()
    meter = TreeCpu(roots)
    before = meter.sample()
    while time.monotonic() - start < timeout:
        time.sleep(window)
        after = meter.sample()
        used = sum(after[k] - before[k] for k in roots)
        if used < share * window:
            break
        before = after
    return time.monotonic() - start
