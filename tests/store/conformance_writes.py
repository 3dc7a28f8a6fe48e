"""What every MetadataStore's writes must do under load: the group commit's promises.

A mixin of the conformance suite (``test_conformance.py`` runs it beside ``StoreConformance`` on
each URL scheme, with its fixtures):

- writes from many writers at once end as if run one by one, in the order they were issued,
  however the store grouped them (a property test over random programs);
- a failed transaction fails every write it carried, applies none of them, and loses nothing
  committed before it; the next write succeeds;
- closing the store with writes in flight: each one queued before ``close`` is committed and its
  writer told so; one issued after is refused with a clear error; none hangs, none is lost after
  being acknowledged;
- many concurrent writers cost one transaction, not one each (the commit count);
- a write that may wait (a session cell's end, ``within``) rides with the next write's
  transaction, commits on its own once its time is up, and is committed by ``close``.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpulayer_kernel.contracts import CellState, JobState, LogRecord
from gpulayer_kernel.errors import StoreError
from gpulayer_kernel.store import JobQuery, MetadataStore, QuotaRecord

from .conformance import Backend, cell, job, lines, worker

STATES = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING, JobState.SUCCEEDED)
KEYS = 2  # a small key space, so that writers collide on the same rows

# One write: (kind, key, value). "pause" awaits a loop turn, moving its writer to a later group.
ops = st.one_of(
    st.tuples(st.just("worker"), st.integers(0, KEYS - 1), st.integers(0, 99)),
    st.tuples(st.just("unworker"), st.integers(0, KEYS - 1), st.just(0)),
    st.tuples(st.just("quota"), st.integers(0, KEYS - 1), st.integers(0, 99)),
    st.tuples(st.just("unquota"), st.integers(0, KEYS - 1), st.just(0)),
    st.tuples(st.just("job"), st.integers(0, KEYS - 1), st.integers(0, len(STATES) - 1)),
    st.tuples(st.just("log"), st.integers(0, KEYS - 1), st.integers(1, 4)),
    st.tuples(st.just("pause"), st.just(0), st.just(0)),
)
programs = st.lists(st.lists(ops, max_size=8), min_size=1, max_size=6)  # writers, each its ops
_namespaces = itertools.count()


@dataclass
class Model:
    """What the store must hold after the writes, applied one by one in the order issued."""

    workers: dict[str, int] = field(default_factory=dict)
    quotas: dict[str, int] = field(default_factory=dict)
    jobs: dict[int, JobState] = field(default_factory=dict)
    logs: dict[int, dict[int, str]] = field(default_factory=dict)


class WriteConformance:
    """The group commit's checks; mixed into a class that has ``StoreConformance``'s fixtures."""

    @settings(
        max_examples=40,
        deadline=None,
        # One store serves every example; each example writes keys of its own.
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(program=programs)
    # Always tried: a delete between two upserts of one key, from three writers in one group;
    # the same across tables and groups (a pause moves a writer to the next one).
    @example(program=[[("worker", 0, 1)], [("unworker", 0, 0)], [("worker", 0, 2)]])
    @example(
        program=[
            [("quota", 1, 1), ("job", 0, 1), ("unquota", 1, 0)],
            [("log", 0, 2), ("pause", 0, 0), ("quota", 1, 5), ("job", 0, 3)],
            [("unquota", 1, 0), ("log", 0, 4), ("job", 0, 2), ("quota", 1, 7)],
        ]
    )
    async def test_writes_from_many_writers_end_as_if_run_in_the_order_issued(
        self, store: MetadataStore, program: list[list[tuple[str, int, int]]]
    ) -> None:
        ns = next(_namespaces)
        model = Model()
        issued = itertools.count()

        async def write(kind: str, key: int, value: int) -> None:
            # Each store call queues its rows before its first await, so the order in which
            # these run (and are recorded) is the order the store received them.
            n = next(issued)
            w, subject, seq = f"n{ns}w{key}", f"user:n{ns}k{key}", 10_000 * ns + key + 1
            if kind == "worker":
                model.workers[w] = value
                await store.save_workers([worker(w, name=f"{value}")])
            elif kind == "unworker":
                model.workers.pop(w, None)
                await store.delete_worker(w)
            elif kind == "quota":
                model.quotas[subject] = value
                await store.save_quota(QuotaRecord(subject, max_gpus=value))
            elif kind == "unquota":
                model.quotas.pop(subject, None)
                await store.delete_quota(subject)
            elif kind == "job":
                model.jobs[seq] = STATES[value]
                await store.save_jobs([job(seq, STATES[value])])
            elif kind == "log":  # a resent line keeps its first text (ON CONFLICT DO NOTHING)
                text = f"write {n}"
                for s in range(1, value + 1):
                    model.logs.setdefault(seq, {}).setdefault(s, text)
                records = [LogRecord(seq=s, time=1.0, stream="stdout", text=text) for s in
                           range(1, value + 1)]  # fmt: skip
                await store.append_logs(f"job{seq:08d}", records)
            else:
                await asyncio.sleep(0)

        async def writer(steps: list[tuple[str, int, int]]) -> None:
            for step in steps:
                await write(*step)

        await asyncio.gather(*(writer(steps) for steps in program))

        workers = {
            w.id: int(w.name) for w in await store.load_workers() if w.id.startswith(f"n{ns}w")
        }
        assert workers == model.workers
        quotas = {
            q.subject: q.max_gpus
            for q in await store.list_quotas()
            if q.subject.startswith(f"user:n{ns}k")
        }
        assert quotas == model.quotas
        for seq, state in model.jobs.items():
            got = await store.get_job(f"job{seq:08d}")
            assert got is not None and got.state == state
        for seq, texts in model.logs.items():
            got = {r.seq: r.text for r in await store.read_logs(f"job{seq:08d}", 0, 100)}
            assert got == texts

    async def test_a_failed_transaction_fails_every_write_in_it_and_keeps_what_was_committed(
        self, store: MetadataStore
    ) -> None:
        await store.save_jobs([job(1, JobState.RUNNING)])
        await store.append_logs("job00000001", lines(range(1, 3)))
        clash = job(2).model_copy(update={"seq": 1})  # seq is unique: the transaction fails
        results = await asyncio.gather(
            store.save_jobs([job(3)]),
            store.append_logs("job00000001", lines(range(3, 5))),
            store.save_workers([worker("w1")]),
            store.save_jobs([clash]),
            return_exceptions=True,
        )
        assert all(isinstance(r, StoreError) for r in results), results
        assert len({id(r) for r in results}) == 1  # one transaction, one error for all
        err: Any = results[0]
        assert err.code == "store_error" and "failed" in err.message
        # Nothing of the failed group, everything from before it.
        assert await store.get_job("job00000003") is None
        assert await store.get_job("job00000002") is None
        assert await store.load_workers() == []
        assert await store.max_log_seq("job00000001") == 2
        assert (await store.get_job("job00000001")) == job(1, JobState.RUNNING)
        # The store carries on: the next group commits.
        await asyncio.gather(store.save_jobs([job(3)]), store.save_workers([worker("w1")]))
        assert [j.seq for j in await store.list_jobs(JobQuery())] == [3, 1]

    async def test_closing_with_writes_in_flight_commits_them_and_refuses_later_ones(
        self, backend: Backend, store_url: str, store: MetadataStore, opened: list[MetadataStore]
    ) -> None:
        async def life(i: int) -> None:
            for state in STATES:
                await store.save_jobs([job(i, state)])

        first = [asyncio.create_task(store.save_jobs([job(i)])) for i in range(1, 101)]
        lives = [asyncio.create_task(life(i)) for i in range(101, 121)]
        await asyncio.sleep(0)  # every task has queued its first write: they are in flight
        await store.close()
        assert await asyncio.gather(*first) == [None] * 100  # each was committed and told so
        ended = await asyncio.gather(*lives, return_exceptions=True)
        for outcome in ended:  # a life's later writes came after close began: done or refused
            assert outcome is None or isinstance(outcome, StoreError), outcome
        refused = [e for e in ended if isinstance(e, StoreError)]
        assert all("not open" in e.message or "closed" in e.message for e in refused)
        with pytest.raises(StoreError) as info:
            await store.save_jobs([job(999)])
        assert info.value.hint
        if not backend.durable:
            return
        store = await self.open(store_url, opened)  # type: ignore[attr-defined]
        assert await store.max_job_seq() == 120
        saved = {j.seq: j.state for j in await store.list_jobs(JobQuery(limit=1000))}
        assert all(saved[i] == JobState.QUEUED for i in range(1, 101))
        assert all(saved[i] in STATES for i in range(101, 121))  # each as far as it got

    async def test_a_cancelled_writer_stops_waiting_but_its_write_still_lands(
        self, store: MetadataStore
    ) -> None:
        waiting = asyncio.create_task(store.save_jobs([job(1)]))
        await asyncio.sleep(0)  # queued
        waiting.cancel()
        await store.save_jobs([job(2)])  # the same group or the next: committed either way
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [j.seq for j in await store.list_jobs(JobQuery())] == [2, 1]

    async def test_a_write_that_may_wait_rides_with_the_next_write(
        self, store: MetadataStore
    ) -> None:
        commits = getattr(store, "commits", None)
        if commits is None:
            pytest.skip("this store does not count its transactions")
        end = asyncio.ensure_future(store.save_cells([cell(1, CellState.OK)], within=60.0))
        await asyncio.sleep(0.05)
        assert not end.done() and store.commits == commits  # type: ignore[attr-defined]
        await store.save_cells([cell(2, CellState.RUNNING)])  # the next cell's start
        await end  # committed with it: one transaction
        assert store.commits - commits == 1  # type: ignore[attr-defined]
        assert [(c.number, c.state) for c in await store.list_cells("s1")] == [
            (2, CellState.RUNNING),
            (1, CellState.OK),
        ]

    async def test_a_write_that_may_wait_commits_alone_when_its_time_is_up(
        self, store: MetadataStore
    ) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(store.save_cells([cell(1, CellState.OK)], within=0.2), 30)
        assert loop.time() - began >= 0.19
        got = await store.get_cell("s1", 1)
        assert got is not None and got.state == CellState.OK

    async def test_closing_commits_a_write_that_may_wait(
        self, backend: Backend, store_url: str, store: MetadataStore, opened: list[MetadataStore]
    ) -> None:
        end = asyncio.ensure_future(store.save_cells([cell(1, CellState.OK)], within=600.0))
        await asyncio.sleep(0)
        await asyncio.wait_for(store.close(), 30)  # not 600 s
        await end
        if not backend.durable:
            return
        store = await self.open(store_url, opened)  # type: ignore[attr-defined]
        got = await store.get_cell("s1", 1)
        assert got is not None and got.state == CellState.OK

    async def test_many_writers_at_once_are_one_transaction(self, store: MetadataStore) -> None:
        commits = getattr(store, "commits", None)
        if commits is None:
            pytest.skip("this store does not count its transactions")
        await asyncio.gather(
            *(store.save_jobs([job(i)]) for i in range(1, 301)),
            *(store.append_logs(f"job{i:08d}", lines(range(1, 3))) for i in range(1, 301)),
            *(store.save_workers([worker(f"w{k}")]) for k in range(20)),
        )
        assert store.commits - commits == 1  # type: ignore[attr-defined]
        assert await store.max_job_seq() == 300
