"""The scheduler's state has an owner: a bounded SchedulerCache, no process-wide GC switch."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest

import gpulayer_kernel.scheduler as scheduler
from gpulayer_kernel.scheduler import SchedulerCache, gc_paused, schedule
from gpulayer_kernel.scheduler.testing import cpu_worker, gpu_worker, job, snapshot


def _cluster() -> list[scheduler.WorkerView]:
    return [
        gpu_worker("w1", 4, "a100"),
        gpu_worker("w2", 8, "h100", labels={"zone": "a"}),
        gpu_worker("w3", 2, "l4", vendor="sim"),
        cpu_worker("c1"),
    ]


def _queue(start: int, n: int = 40) -> list[scheduler.JobRequest]:
    # New Resources objects every call: what a stream of submissions looks like to the cache.
    return [
        job(
            f"job-{k:05d}",
            seq=k,
            gpus=k % 5,
            kind=["a100", "h100", None, "sim"][k % 4] if k % 5 else None,
            selector={"zone": "a"} if k % 7 == 0 else None,
            cpus=float(k % 3) or None,
        )
        for k in range(start, start + n)
    ]


def test_the_cache_holds_only_what_the_last_pass_used() -> None:
    cache = SchedulerCache()
    workers = _cluster()
    for round_ in range(40):
        # Fresh capabilities objects now and then (workers joined again) and a fresh queue each
        # time: the entries of earlier passes must go, not pile up.
        if round_ % 3 == 2:
            workers = [replace(w, capabilities=w.capabilities.model_copy()) for w in workers]
        snap = snapshot(workers, _queue(round_ * 1000, n=40 + round_ % 7))
        schedule(snap, cache)
        fresh = SchedulerCache()
        schedule(snap, fresh)
        # At most what a fresh pass derives: a warm pass may need less (a report template it
        # finds whole needs none of the reason counts it is made of).
        assert 0 < cache.size() <= fresh.size()
    schedule(snapshot(workers, []), cache)
    # A profile and its number per worker, the standing cluster, no job.
    assert cache.size() <= 2 * len(workers) + 1


def test_equal_objects_share_a_number_and_distinct_ones_do_not() -> None:
    cache = SchedulerCache()
    a = gpu_worker("a", 4, "a100").capabilities
    b = a.model_copy()  # equal, not the same object
    c = gpu_worker("c", 4, "h100").capabilities
    with cache.open_pass() as memo:
        pa, pb, pc = memo.profile(a), memo.profile(b), memo.profile(c)
        assert pa is not pb and pa.uid == pb.uid != pc.uid
        assert memo.profile(a) is pa  # by identity: derived once per object
    with cache.open_pass() as memo:
        memo.profile(b)  # a is not used this pass
    with cache.open_pass() as memo:
        # b's entry lived on, so a returning object equal to it gets its number.
        assert memo.profile(a).uid == pb.uid
        r1 = job("x", 1, gpus=2, kind="a100").resources
        r2 = job("y", 2, gpus=2, kind="a100").resources
        r3 = job("z", 3, gpus=1).resources
        assert memo.shape_key(r1) == memo.shape_key(r2) != memo.shape_key(r3)


def test_a_cache_in_use_by_another_pass_is_not_shared() -> None:
    cache = SchedulerCache()
    snap = snapshot(_cluster(), _queue(0))
    with cache.open_pass() as held:
        assert held is cache
        with cache.open_pass() as other:
            assert other is not cache  # e.g. a thread still running an abandoned pass
        assert schedule(snap, cache) == schedule(snap)


def test_schedule_never_touches_the_garbage_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("schedule() switched the process-wide collector off")

    monkeypatch.setattr(gc, "disable", refuse)
    plan = schedule(snapshot(_cluster(), _queue(0)), SchedulerCache())
    assert plan.assignments
    assert gc.isenabled()


def test_gc_paused_pauses_for_the_block_and_restores_the_state() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves the outer one's pause alone
        raise RuntimeError("a pass that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_no_module_level_state_changes_in_a_pass() -> None:
    """Module-level containers are constants (tables, frozen fits): a pass leaves them as it
    found them, so nothing a pass derives outlives it but in the SchedulerCache handed to it."""
    import gpulayer_kernel.scheduler.cache as cache
    import gpulayer_kernel.scheduler.explain as explain
    import gpulayer_kernel.scheduler.feasible as feasible
    import gpulayer_kernel.scheduler.plan as plan
    import gpulayer_kernel.scheduler.rank as rank
    import gpulayer_kernel.scheduler.reports as reports

    def containers() -> dict[str, int]:
        return {
            f"{module.__name__}.{name}": len(value)
            for module in (cache, explain, feasible, plan, rank, reports)
            for name, value in vars(module).items()
            if isinstance(value, dict | list | set) and not name.startswith("__")
        }

    before = containers()
    for start in (0, 1000, 2000):
        schedule(snapshot(_cluster(), _queue(start)))
    assert containers() == before
