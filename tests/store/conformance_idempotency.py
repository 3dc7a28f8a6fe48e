"""What every MetadataStore must do with idempotency keys (ADR 0003).

A mixin of the conformance suite (``test_conformance.py`` runs it on each URL scheme): a record
round-trips; it is scoped by owner; an upsert replaces it; a note queued before a job's row is
committed with it (or before it), never after; purging forgets only records older than the
window; a reopened store still has them.
"""

from __future__ import annotations

import asyncio
import dataclasses

from gpulayer_kernel.store import IdempotencyRecord, MetadataStore

from .conformance import Backend, job


def record(owner: str = "alice", key: str = "k1", **kw: object) -> IdempotencyRecord:
    rec = IdempotencyRecord(owner=owner, key=key, fingerprint="f" * 64, created_at=1000.0)
    return dataclasses.replace(rec, **kw)  # type: ignore[arg-type]


class IdempotencyConformance:
    """The checks; mixed into a class that has ``StoreConformance``'s fixtures."""

    async def test_a_record_round_trips_and_an_upsert_replaces_it(
        self, store: MetadataStore
    ) -> None:
        assert await store.get_idempotency("alice", "k1") is None
        pending = record(jobs=("job00000001",))
        await store.save_idempotency(pending)
        assert await store.get_idempotency("alice", "k1") == pending
        answered = dataclasses.replace(pending, status=201, answer='{"id": "job00000001"}')
        await store.save_idempotency(answered)
        assert await store.get_idempotency("alice", "k1") == answered
        await store.delete_idempotency("alice", "k1")
        assert await store.get_idempotency("alice", "k1") is None

    async def test_keys_are_scoped_by_owner(self, store: MetadataStore) -> None:
        await store.save_idempotency(record("alice", status=201, answer="a"))
        await store.save_idempotency(record("bob", status=409, answer="b"))
        alice = await store.get_idempotency("alice", "k1")
        bob = await store.get_idempotency("bob", "k1")
        assert alice is not None and alice.answer == "a"
        assert bob is not None and bob.answer == "b" and bob.status == 409

    async def test_a_note_queued_before_a_job_commits_no_later_than_the_job(
        self, store: MetadataStore
    ) -> None:
        # Queued with no await between, as ControlPlane.enqueue does: one group commit.
        commits = getattr(store, "commits", None)
        note = store.queue_idempotency(record(jobs=("job00000007",)))
        await store.save_jobs([job(7)])
        assert (await asyncio.wait_for(asyncio.ensure_future(note), 5)) is None
        if commits is not None:
            assert store.commits - commits == 1  # type: ignore[attr-defined]
        found = await store.get_idempotency("alice", "k1")
        assert found is not None and found.jobs == ("job00000007",)

    async def test_purging_forgets_only_records_older_than_the_window(
        self, store: MetadataStore
    ) -> None:
        await store.save_idempotency(record(key="old"))
        await store.save_idempotency(dataclasses.replace(record(key="new"), created_at=2000.0))
        await store.purge_idempotency(1500.0)
        assert await store.get_idempotency("alice", "old") is None
        assert await store.get_idempotency("alice", "new") is not None

    async def test_records_survive_reopening(
        self,
        backend: Backend,
        store_url: str,
        store: MetadataStore,
        opened: list[MetadataStore],
    ) -> None:
        if not backend.durable:
            return
        kept = record(status=201, answer="{}", jobs=("a", "b"))
        await store.save_idempotency(kept)
        again = await self.reopened(store, store_url, opened)  # type: ignore[attr-defined]
        assert await again.get_idempotency("alice", "k1") == kept
