"""What every MetadataStore must do with the audit log and tokens' last use (migration 8, ADR
0020).

A mixin of the conformance suite (``test_conformance.py`` runs it on SQLite and on a real
PostgreSQL): an entry round-trips exactly (a clock reading to the microsecond, a role of None, a
nested detail); pages come newest first, each entry once, filtered by actor, action and time,
with the count of all that match; an entry queued before a job's row commits with it; a seq is
written once (append-only); a token's last use is replaced by a later one; a reopened store
still has both.
"""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_kernel.store import AuditEntry, AuditQuery, MetadataStore

from .conformance import Backend, job

T0 = 1796176128.352233  # a real clock reading: a 4-byte REAL would round it to 128 s


def entry(seq: int, actor: str = "alice", action: str = "job.submit", **kw: object) -> AuditEntry:
    fields: dict[str, object] = {
        "seq": seq,
        "at": T0 + seq,
        "actor": actor,
        "role": "user",
        "action": action,
        "target": f"job{seq:08d}",
        "detail": {"name": f"j{seq}"},
    }
    return AuditEntry(**(fields | kw))  # type: ignore[arg-type]


async def append(store: MetadataStore, *entries: AuditEntry) -> None:
    await asyncio.gather(*(store.queue_audit(e) for e in entries))


class AuditConformance:
    """The checks; mixed into a class that has ``StoreConformance``'s fixtures."""

    async def test_an_entry_round_trips_exactly(self, store: MetadataStore) -> None:
        assert await store.max_audit_seq() == 0
        assert await store.list_audit(AuditQuery()) == ([], 0)
        odd = entry(
            1,
            actor="worker:box-1",
            role=None,
            action="token.create",
            target="tok_ab12",
            detail={"kind": "join", "ttl": 3600.5, "names": ["a", "é"], "nested": {"n": None}},
        )
        await append(store, odd)
        assert await store.list_audit(AuditQuery()) == ([odd], 1)
        assert await store.max_audit_seq() == 1

    async def test_pages_come_newest_first_each_entry_once_with_the_total(
        self, store: MetadataStore
    ) -> None:
        await append(store, *(entry(s) for s in range(1, 8)))
        seen: list[int] = []
        before = None
        while True:
            page, total = await store.list_audit(AuditQuery(before=before, limit=3))
            assert total == 7  # all that match, whatever the page
            if not page:
                break
            seen += [e.seq for e in page]
            before = page[-1].seq
        assert seen == [7, 6, 5, 4, 3, 2, 1]
        assert await store.max_audit_seq() == 7

    async def test_filters_by_actor_action_and_time_combine(self, store: MetadataStore) -> None:
        await append(
            store,
            entry(1, "alice", "job.submit"),
            entry(2, "bob", "job.submit"),
            entry(3, "alice", "job.cancel"),
            entry(4, "alice", "job.submit"),
            entry(5, "bob", "secret.set", detail={"name": "HF_TOKEN"}),
        )

        async def seqs(**q: object) -> tuple[list[int], int]:
            page, total = await store.list_audit(AuditQuery(**q))  # type: ignore[arg-type]
            return [e.seq for e in page], total

        assert await seqs(actor="alice") == ([4, 3, 1], 3)
        assert await seqs(action="job.submit") == ([4, 2, 1], 3)
        assert await seqs(actor="alice", action="job.submit") == ([4, 1], 2)
        assert await seqs(since=T0 + 3) == ([5, 4, 3], 3)  # at or after
        assert await seqs(actor="bob", since=T0 + 3) == ([5], 1)
        assert await seqs(actor="alice", before=4, limit=1) == ([3], 3)
        assert await seqs(actor="carol") == ([], 0)

    async def test_an_entry_queued_before_a_job_commits_with_it(self, store: MetadataStore) -> None:
        # Queued with no await between, as the control plane does: one group commit.
        commits = getattr(store, "commits", None)
        noted = store.queue_audit(entry(1, target="job00000007"))
        await store.save_jobs([job(7)])
        await asyncio.wait_for(asyncio.ensure_future(noted), 5)  # committed, not failed
        if commits is not None:
            assert store.commits - commits == 1  # type: ignore[attr-defined]
        assert [e.target for e in (await store.list_audit(AuditQuery()))[0]] == ["job00000007"]

    async def test_a_seq_is_written_once(self, store: MetadataStore) -> None:
        first = entry(1)
        await append(store, first)
        with pytest.raises(Exception):  # noqa: B017 - each database names its own error
            await append(store, entry(1, actor="mallory", action="job.cancel"))
        assert await store.list_audit(AuditQuery()) == ([first], 1)

    async def test_a_token_s_last_use_is_replaced_by_a_later_one(
        self, store: MetadataStore
    ) -> None:
        assert await store.token_uses() == {}
        await asyncio.gather(store.queue_token_use("t1", T0), store.queue_token_use("t2", T0 + 1))
        await store.queue_token_use("t1", T0 + 60.25)
        assert await store.token_uses() == {"t1": T0 + 60.25, "t2": T0 + 1}

    async def test_entries_and_uses_survive_reopening(
        self,
        backend: Backend,
        store_url: str,
        store: MetadataStore,
        opened: list[MetadataStore],
    ) -> None:
        if not backend.durable:
            return
        kept = [entry(1), entry(2, actor="bob", role="admin", action="role.set")]
        await append(store, *kept)
        await store.queue_token_use("t1", T0)
        again = await self.reopened(store, store_url, opened)  # type: ignore[attr-defined]
        assert await again.list_audit(AuditQuery()) == (kept[::-1], 2)
        assert await again.max_audit_seq() == 2  # a new leader numbers on from here
        assert await again.token_uses() == {"t1": T0}
