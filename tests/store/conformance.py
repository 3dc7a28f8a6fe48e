"""What every MetadataStore must do: one suite, run against each implementation.

A test module subclasses ``StoreConformance`` and provides a ``backend`` fixture (a ``Backend``:
how to make a fresh store's URL, and how to read or write its schema version behind its back);
``test_conformance.py`` does so for every URL scheme ``open_store`` knows. The stores come from
``open_store(url)``, so the suite also checks the factory's wiring.

The interface has no event log (the control plane keeps its events in memory), so there is nothing
to check for events here; when a store grows one, its checks belong in this file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    Budget,
    CellRun,
    CellState,
    CommandWorkload,
    CostEntry,
    CostKind,
    Instance,
    InstanceState,
    Job,
    JobSpec,
    JobState,
    LogRecord,
    Offer,
    SessionHolder,
    SessionRecord,
    WorkerInfo,
    WorkerState,
)
from gpulayer_kernel.errors import SchemaTooNew
from gpulayer_kernel.store import (
    JobQuery,
    MetadataStore,
    QuotaRecord,
    SecretRecord,
    TokenRecord,
    UserRecord,
    open_store,
)


@dataclass(frozen=True)
class Backend:
    """One MetadataStore implementation, as the suite drives it."""

    name: str
    url: Callable[[Path], str]  # a fresh, empty store's URL, given a private folder
    latest_schema: int  # the schema version a fresh store must end at
    # Reopening the same URL finds the same data (False: an in-memory store). The schema hooks
    # are only called on durable backends: they reach the database behind the store's back.
    durable: bool = True
    read_schema: Callable[[str], int] | None = None
    write_schema: Callable[[str, int], None] | None = None


def cell(number: int, state: CellState = CellState.OK) -> CellRun:
    """Cell ``number`` of session s1."""
    return CellRun(
        session_id="s1",
        number=number,
        state=state,
        code_sha256="0" * 64,
        code=f"x = {number}",
        submitted_at=float(number),
    )


def job(i: int, state: JobState = JobState.QUEUED, name: str = "", **labels: str) -> Job:
    spec = JobSpec(name=name or f"j{i}", workload=CommandWorkload(argv=["true"]), labels=labels)
    return Job(id=f"job{i:08d}", seq=i, spec=spec, state=state, submitted_at=1000.0 + i)


def worker(worker_id: str, name: str = "", state: WorkerState = WorkerState.READY) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id, name=name or worker_id, state=state, registered_at=1.0, last_heartbeat=2.0
    )


def lines(job_seqs: range) -> list[LogRecord]:
    return [LogRecord(seq=s, time=float(s), stream="stdout", text=f"line {s}") for s in job_seqs]


def token(token_id: str, created_at: float, **kw: object) -> TokenRecord:
    return TokenRecord(
        id=token_id,
        kind="client",
        hash=f"h-{token_id}",
        created_at=created_at,
        expires_at=None,
        **kw,  # type: ignore[arg-type]
    )


class StoreConformance:
    """The checks; subclass it in a test module that provides the ``backend`` fixture."""

    @pytest.fixture
    def store_url(self, backend: Backend, tmp_path: Path) -> str:
        return backend.url(tmp_path)

    @pytest.fixture
    async def opened(self) -> AsyncIterator[list[MetadataStore]]:
        """Every store a test opens; all closed at its end, whatever happens (an open store
        holds a thread that would keep the test process alive)."""
        stores: list[MetadataStore] = []
        try:
            yield stores
        finally:
            for s in stores:
                await s.close()

    @pytest.fixture
    async def store(self, store_url: str, opened: list[MetadataStore]) -> MetadataStore:
        return await self.open(store_url, opened)

    @staticmethod
    async def open(url: str, opened: list[MetadataStore]) -> MetadataStore:
        store = open_store(url)
        opened.append(store)
        await store.open()
        return store

    async def reopened(
        self, store: MetadataStore, url: str, opened: list[MetadataStore]
    ) -> MetadataStore:
        await store.close()
        return await self.open(url, opened)

    # -- jobs -----------------------------------------------------------------------------------

    async def test_jobs_save_get_list_and_query(self, store: MetadataStore) -> None:
        await store.save_jobs(
            [job(1), job(2, JobState.SUCCEEDED, team="vision"), job(3, name="train")]
        )
        got = await store.get_job("job00000002")
        assert got == job(2, JobState.SUCCEEDED, team="vision")
        assert await store.get_job("missing") is None
        assert [j.seq for j in await store.list_jobs(JobQuery())] == [3, 2, 1]  # newest first
        assert [j.seq for j in await store.list_jobs(JobQuery(limit=2))] == [3, 2]
        assert [j.seq for j in await store.list_jobs(JobQuery(before_seq=3))] == [2, 1]
        queued = await store.list_jobs(JobQuery(states=[JobState.QUEUED]))
        assert [j.id for j in queued] == ["job00000003", "job00000001"]
        both = JobQuery(states=[JobState.QUEUED, JobState.SUCCEEDED], limit=10)
        assert len(await store.list_jobs(both)) == 3
        assert [j.seq for j in await store.list_jobs(JobQuery(name="train"))] == [3]
        labelled = await store.list_jobs(JobQuery(label=("team", "vision")))
        assert [j.id for j in labelled] == ["job00000002"]
        assert await store.list_jobs(JobQuery(label=("team", "audio"))) == []
        assert await store.max_job_seq() == 3
        assert await store.count_jobs() == {"queued": 2, "succeeded": 1}

    async def test_job_ids_are_found_by_literal_prefix(self, store: MetadataStore) -> None:
        assert await store.max_job_seq() == 0
        assert await store.count_jobs() == {}
        await store.save_jobs([job(1), job(2), job(3)])
        assert await store.find_job_ids("job0000000") == ["job00000001", "job00000002"]
        assert await store.find_job_ids("job0000000", limit=5) == [
            "job00000001",
            "job00000002",
            "job00000003",
        ]
        assert await store.find_job_ids("job00000003") == ["job00000003"]
        assert await store.find_job_ids("job_") == []  # '_' and '%' are not wildcards
        assert await store.find_job_ids("%") == []

    async def test_transitions_are_persisted_and_the_last_one_wins(
        self, store: MetadataStore, backend: Backend, store_url: str, opened: list[MetadataStore]
    ) -> None:
        queued = job(7)
        placed = queued.model_copy(update={"state": JobState.PLACED, "placed_at": 1.0})
        running = placed.model_copy(update={"state": JobState.RUNNING, "started_at": 2.0})
        done = running.model_copy(
            update={"state": JobState.SUCCEEDED, "finished_at": 3.0, "exit_code": 0, "result": 42}
        )
        for step in (queued, placed, running):
            await store.save_jobs([step])
            assert await store.get_job(queued.id) == step
        await store.save_jobs([done])
        assert await store.list_jobs(JobQuery(states=[JobState.RUNNING])) == []
        assert await store.count_jobs() == {"succeeded": 1}
        if backend.durable:
            store = await self.reopened(store, store_url, opened)
        assert await store.get_job(queued.id) == done
        assert [j.id for j in await store.list_jobs(JobQuery(states=[JobState.SUCCEEDED]))] == [
            queued.id
        ]

    # -- logs -----------------------------------------------------------------------------------

    async def test_logs_append_page_and_ignore_resent_lines(self, store: MetadataStore) -> None:
        await store.append_logs("a", lines(range(1, 6)))
        await store.append_logs("a", lines(range(3, 9)))  # a resent batch overlapping the last
        await store.append_logs("b", lines(range(1, 3)))
        assert await store.max_log_seq("a") == 8
        assert await store.max_log_seq("b") == 2
        assert await store.max_log_seq("nobody") == 0
        assert await store.read_logs("nobody", 0, 10) == []
        pages: list[list[int]] = []
        since = 0
        while page := await store.read_logs("a", since, 3):
            pages.append([r.seq for r in page])
            since = page[-1].seq
        assert pages == [[1, 2, 3], [4, 5, 6], [7, 8]]
        got = await store.read_logs("a", 7, 100)
        assert [(r.seq, r.text, r.stream) for r in got] == [(8, "line 8", "stdout")]
        assert [r.text for r in await store.read_logs("b", 0, 100)] == ["line 1", "line 2"]

    async def test_a_log_page_is_bounded_by_bytes_and_says_whether_more_follow(
        self, store: MetadataStore
    ) -> None:
        # Issue 32: a page is cut by size, not only by count (a record can be 64 KiB); the
        # first record always comes, so a page never stalls on one big record.
        big = "x" * 1000
        records = [LogRecord(seq=i, time=0.0, stream="stdout", text=big) for i in range(1, 11)]
        await store.append_logs("a", records)
        page, more = await store.read_log_page("a", 0, 100, 2500)
        assert [r.seq for r in page] == [1, 2, 3] and more
        page, more = await store.read_log_page("a", 3, 100, 10)
        assert [r.seq for r in page] == [4] and more
        page, more = await store.read_log_page("a", 8, 100, 1 << 20)
        assert [r.seq for r in page] == [9, 10] and not more
        page, more = await store.read_log_page("a", 0, 4, 1 << 20)
        assert [r.seq for r in page] == [1, 2, 3, 4] and more
        assert await store.read_log_page("a", 10, 100, 10) == ([], False)
        page, more = await store.read_log_page("a", 6, 4, 1 << 20)
        assert [r.seq for r in page] == [7, 8, 9, 10] and not more

    async def test_log_records_keep_every_field(self, store: MetadataStore) -> None:
        record = LogRecord(seq=1, time=12.5, stream="stderr", rank=3, text="boom ünïcode")
        display = LogRecord(
            seq=2,
            time=13.0,
            stream="display",
            rank=0,
            text="<Figure>",
            cell=7,
            data={"data": {"text/plain": "<Figure>", "image/png": "iVBOR"}, "metadata": {}},
        )
        await store.append_logs("j", [record, display])
        got = await store.read_logs("j", 0, 2)
        assert [r.model_dump() for r in got] == [record.model_dump(), display.model_dump()]

    # -- sessions (ADR 0019) --------------------------------------------------------------------

    async def test_cells_are_saved_updated_and_listed_newest_first(
        self, store: MetadataStore
    ) -> None:
        await store.save_cells([cell(1), cell(2, CellState.RUNNING), cell(3)])
        await store.save_cells([cell(2, CellState.ERROR)])  # a cell's end replaces its start
        await store.save_cells([cell(1).model_copy(update={"session_id": "other"})])
        assert [c.number for c in await store.list_cells("s1")] == [3, 2, 1]
        assert [c.number for c in await store.list_cells("s1", limit=2)] == [3, 2]
        assert [c.number for c in await store.list_cells("s1", before=3)] == [2, 1]
        got = await store.get_cell("s1", 2)
        assert got is not None and got.state == CellState.ERROR and got.code == "x = 2"
        assert await store.get_cell("s1", 9) is None
        assert await store.list_cells("nobody") == []

    async def test_session_records_are_saved_and_loaded(self, store: MetadataStore) -> None:
        holder = SessionHolder(client="k1", notebook="a.ipynb")
        one = SessionRecord(id="s1", name="train", holder=holder, cells=3)
        await store.save_sessions([one, SessionRecord(id="s2", name="eval", holder=holder)])
        attached = one.model_copy(
            update={"holder": SessionHolder(client="k2"), "broken": "rank 1 died"}
        )
        await store.save_sessions([attached])
        loaded = {s.id: s for s in await store.load_sessions(["s1", "s2", "s3"])}
        assert loaded["s1"] == attached and loaded["s2"].name == "eval" and "s3" not in loaded
        assert await store.load_sessions([]) == []

    # -- secrets --------------------------------------------------------------------------------

    async def test_secrets_set_get_list_delete(self, store: MetadataStore) -> None:
        assert await store.list_secret_names() == []
        assert await store.get_secrets([]) == {}
        await store.set_secret("HF_TOKEN", "hf_1")
        await store.set_secret("AWS_KEY", "k")
        await store.set_secret("HF_TOKEN", "hf_2")  # overwrite
        assert await store.list_secret_names() == ["AWS_KEY", "HF_TOKEN"]
        assert await store.get_secrets(["HF_TOKEN", "NOPE"]) == {"HF_TOKEN": "hf_2"}
        assert await store.delete_secret("HF_TOKEN")
        assert not await store.delete_secret("HF_TOKEN")
        assert await store.get_secrets(["HF_TOKEN", "AWS_KEY"]) == {"AWS_KEY": "k"}

    async def test_secrets_belong_to_their_owner(self, store: MetadataStore) -> None:
        await store.set_secret("HF_TOKEN", "sealed-a", owner="alice")
        await store.set_secret("HF_TOKEN", "sealed-b", owner="bob")
        await store.set_secret("ONLY_BOB", "sealed-c", owner="bob")
        assert await store.get_secrets(["HF_TOKEN", "ONLY_BOB"], owner="alice") == {
            "HF_TOKEN": "sealed-a"
        }
        assert await store.list_secret_names(owner="bob") == ["HF_TOKEN", "ONLY_BOB"]
        assert await store.list_secret_names() == []  # the admin's own: none
        assert not await store.delete_secret("ONLY_BOB", owner="alice")  # not hers: no change
        assert await store.list_secret_names(owner="bob") == ["HF_TOKEN", "ONLY_BOB"]
        assert await store.delete_secret("HF_TOKEN", owner="alice")
        assert await store.get_secrets(["HF_TOKEN"], owner="bob") == {"HF_TOKEN": "sealed-b"}
        every = await store.list_secrets()
        assert [(r.owner, r.name, r.value) for r in every] == [
            ("bob", "HF_TOKEN", "sealed-b"),
            ("bob", "ONLY_BOB", "sealed-c"),
        ]
        resealed = [SecretRecord(r.owner, r.name, "v2:" + r.value, r.updated_at) for r in every]
        await store.replace_secrets(resealed)
        assert await store.list_secrets() == resealed

    # -- users, quotas, blob owners -----------------------------------------------------------

    async def test_users_are_created_listed_and_updated(self, store: MetadataStore) -> None:
        assert await store.list_users() == []
        alice = UserRecord(name="alice", role="user", created_at=5.0, group="vision")
        await store.save_user(alice)
        await store.save_user(UserRecord(name="admin", role="admin", created_at=1.0))
        assert [u.name for u in await store.list_users()] == ["admin", "alice"]
        disabled = UserRecord(name="alice", role="viewer", created_at=99.0, disabled=True)
        await store.save_user(disabled)  # an update: created_at stays
        got = {u.name: u for u in await store.list_users()}["alice"]
        assert got == UserRecord(name="alice", role="viewer", created_at=5.0, disabled=True)

    async def test_quotas_are_set_listed_and_cleared(self, store: MetadataStore) -> None:
        await store.save_quota(QuotaRecord("user:alice", max_gpus=4))
        await store.save_quota(QuotaRecord("group:vision", max_gpus=8, max_queued=100))
        await store.save_quota(QuotaRecord("user:alice", max_gpus=2, max_queued=10))
        assert await store.list_quotas() == [
            QuotaRecord("group:vision", max_gpus=8, max_queued=100),
            QuotaRecord("user:alice", max_gpus=2, max_queued=10),
        ]
        await store.delete_quota("group:vision")
        await store.delete_quota("group:never")
        assert [q.subject for q in await store.list_quotas()] == ["user:alice"]

    async def test_blob_owners(self, store: MetadataStore) -> None:
        d = "ab" * 32
        assert not await store.blob_owned(d, "alice")
        await store.add_blob_owners([(d, "alice"), (d, "alice"), ("cd" * 32, "bob")])
        await store.add_blob_owners([(d, "alice")])  # again: no error, no second row
        assert await store.blob_owned(d, "alice")
        assert not await store.blob_owned(d, "bob")
        assert await store.blob_owned("cd" * 32, "bob")

    # -- tokens ---------------------------------------------------------------------------------

    async def test_client_tokens_keep_their_user_and_role(self, store: MetadataStore) -> None:
        rec = token("t9", created_at=1.0, owner="alice", role="viewer")
        await store.save_token(rec)
        assert await store.get_token("t9") == rec

    async def test_tokens_are_created_read_and_updated(self, store: MetadataStore) -> None:
        assert await store.list_tokens() == []
        first = token("t1", created_at=10.0, name="laptop")
        second = token("t2", created_at=5.0, worker_id=None)
        await store.save_token(first)
        await store.save_token(second)
        assert await store.get_token("t1") == first
        assert await store.get_token("missing") is None
        assert [t.id for t in await store.list_tokens()] == ["t2", "t1"]  # oldest first
        used = TokenRecord(
            id="t2",
            kind="client",
            hash="h-t2",
            created_at=5.0,
            expires_at=99.0,
            revoked=True,
            used=True,
            worker_id="w1",
        )
        await store.save_token(used)  # revoke, mark used, bind: an update, not a second token
        assert await store.get_token("t2") == used
        assert len(await store.list_tokens()) == 2

    # -- workers --------------------------------------------------------------------------------

    async def test_workers_save_load_update_delete(
        self, store: MetadataStore, backend: Backend, store_url: str, opened: list[MetadataStore]
    ) -> None:
        assert await store.load_workers() == []
        await store.save_workers([worker("w1"), worker("w2")])
        await store.save_workers([worker("w1", name="renamed", state=WorkerState.CORDONED)])
        by_id = {w.id: w for w in await store.load_workers()}
        assert by_id == {
            "w1": worker("w1", name="renamed", state=WorkerState.CORDONED),
            "w2": worker("w2"),
        }
        await store.delete_worker("w2")
        await store.delete_worker("never-there")  # no error: removal is idempotent
        if backend.durable:
            store = await self.reopened(store, store_url, opened)  # a removal survives a restart
        assert [w.id for w in await store.load_workers()] == ["w1"]

    # -- ordering and concurrency ---------------------------------------------------------------

    async def test_writes_queued_together_end_as_if_run_in_order(
        self, store: MetadataStore
    ) -> None:
        # Each call queues its write before yielding, so all of them reach the store in this
        # order, and a store that batches them must still end where running them one by one
        # would: the delete stays between the two saves.
        await asyncio.gather(
            store.save_workers([worker("w1", name="first")]),
            store.delete_worker("w1"),
            store.save_workers([worker("w1", name="second")]),
            store.save_workers([worker("w2")]),
            store.delete_worker("w2"),
        )
        assert [(w.id, w.name) for w in await store.load_workers()] == [("w1", "second")]
        await asyncio.gather(
            store.save_jobs([job(1)]),
            store.append_logs("job00000001", lines(range(1, 3))),
            store.save_jobs([job(1, JobState.RUNNING)]),
            store.append_logs("job00000001", lines(range(3, 5))),
            store.save_jobs([job(1, JobState.SUCCEEDED)]),
        )
        assert (await store.get_job("job00000001")) == job(1, JobState.SUCCEEDED)
        assert await store.max_log_seq("job00000001") == 4

    async def test_many_concurrent_writers_end_consistent(self, store: MetadataStore) -> None:
        n = 120

        async def life(i: int) -> None:
            await store.save_jobs([job(i)])
            await store.append_logs(f"job{i:08d}", lines(range(1, 4)))
            await store.save_jobs([job(i, JobState.RUNNING)])
            await store.append_logs(f"job{i:08d}", lines(range(4, 7)))
            await store.save_jobs([job(i, JobState.SUCCEEDED if i % 2 else JobState.FAILED)])

        async def heartbeat(k: int) -> None:
            await store.save_workers([worker(f"w{k % 5}", name=f"beat{k}")])

        await asyncio.gather(
            *(life(i) for i in range(1, n + 1)),
            *(heartbeat(k) for k in range(40)),
            *(store.set_secret(f"S{k}", str(k)) for k in range(20)),
        )
        assert await store.max_job_seq() == n
        assert await store.count_jobs() == {"succeeded": n // 2, "failed": n // 2}
        for i in (1, n // 2, n):
            assert [r.seq for r in await store.read_logs(f"job{i:08d}", 0, 100)] == [
                1,
                2,
                3,
                4,
                5,
                6,
            ]
        assert sorted(w.id for w in await store.load_workers()) == [f"w{k}" for k in range(5)]
        assert len(await store.list_secret_names()) == 20

    async def test_two_stores_on_one_database_see_each_others_writes(
        self, backend: Backend, store_url: str, store: MetadataStore, opened: list[MetadataStore]
    ) -> None:
        if not backend.durable:
            pytest.skip("an in-memory database belongs to one connection")
        other = await self.open(store_url, opened)
        await asyncio.gather(
            *(store.save_jobs([job(i)]) for i in range(1, 30, 2)),
            *(other.save_jobs([job(i)]) for i in range(2, 31, 2)),
        )
        for s in (store, other):
            assert await s.max_job_seq() == 30
            assert len(await s.list_jobs(JobQuery(limit=100))) == 30

    # -- provider instances, the cost ledger, budgets (migration 5) -----------------------------

    async def test_instances_are_upserted_and_listed_newest_first(
        self, store: MetadataStore
    ) -> None:
        offer = Offer(provider="p", name="x", gpus=1, price_per_hour=1.0)

        def inst(i: int, state: InstanceState) -> Instance:
            return Instance(
                id=f"{i:012x}",
                provider="p",
                offer=offer,
                state=state,
                worker_name=f"p-{i}",
                requested_at=float(i),
                boot_deadline=float(i) + 60,
            )

        await store.save_instances([inst(1, InstanceState.JOINED), inst(2, InstanceState.BOOTING)])
        await store.save_instances([inst(1, InstanceState.TERMINATED)])
        assert [i.id for i in await store.load_instances()] == ["000000000002"]
        everything = await store.load_instances(ended=True)
        assert [(i.id, i.state) for i in everything] == [
            ("000000000002", InstanceState.BOOTING),
            ("000000000001", InstanceState.TERMINATED),
        ]

    async def test_a_cost_row_written_twice_is_one_row(self, store: MetadataStore) -> None:
        def row(job_id: str, kind: CostKind, amount: float, at: float) -> CostEntry:
            return CostEntry(job_id=job_id, attempt=0, kind=kind, amount=amount, at=at)

        await store.save_costs([row("a", CostKind.ESTIMATE, 2.0, 10.0)])
        for _ in range(3):  # at-least-once: the same charge, again and again
            await store.save_costs([row("a", CostKind.CHARGE, 0.5, 20.0)])
        await store.save_jobs_and_costs([job(1)], [row("b", CostKind.ESTIMATE, 1.0, 30.0)])
        assert await store.get_job("job00000001") == job(1)
        rows = await store.list_costs()
        assert [(r.job_id, r.kind, r.amount) for r in rows] == [
            ("a", CostKind.ESTIMATE, 2.0),
            ("a", CostKind.CHARGE, 0.5),
            ("b", CostKind.ESTIMATE, 1.0),
        ]
        assert [r.job_id for r in await store.list_costs(since=15.0)] == ["a", "b"]
        assert len(await store.list_costs(job_id="a")) == 2

    async def test_budgets_are_saved_changed_and_deleted(self, store: MetadataStore) -> None:
        b = Budget(name="team", scope="project", match="vision", limit=10)
        await store.save_budget(b)
        await store.save_budget(b.model_copy(update={"limit": 20.0}))
        assert [x.limit for x in await store.load_budgets()] == [20.0]
        assert await store.delete_budget("team") and not await store.delete_budget("team")
        assert await store.load_budgets() == []

    # -- migrations -----------------------------------------------------------------------------

    async def test_a_fresh_store_gets_the_latest_schema_once(
        self, backend: Backend, store_url: str, store: MetadataStore, opened: list[MetadataStore]
    ) -> None:
        if not backend.durable or backend.read_schema is None:
            pytest.skip("the schema of this store cannot be read behind its back")
        assert backend.read_schema(store_url) == backend.latest_schema
        await store.save_jobs([job(1)])
        store = await self.reopened(store, store_url, opened)  # reopening migrates nothing again
        assert backend.read_schema(store_url) == backend.latest_schema
        assert await store.get_job("job00000001") == job(1)

    async def test_a_store_with_a_newer_schema_is_refused_and_left_alone(
        self, backend: Backend, store_url: str, store: MetadataStore, opened: list[MetadataStore]
    ) -> None:
        if not backend.durable or backend.write_schema is None or backend.read_schema is None:
            pytest.skip("the schema of this store cannot be written behind its back")
        await store.save_jobs([job(1)])
        await store.close()
        newer = backend.latest_schema + 7
        backend.write_schema(store_url, newer)
        with pytest.raises(SchemaTooNew) as info:
            await self.open(store_url, opened)
        assert f"schema version {newer}" in info.value.message
        assert info.value.hint
        assert backend.read_schema(store_url) == newer
