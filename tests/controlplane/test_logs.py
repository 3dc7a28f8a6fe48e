"""Log tails on their own: numbering, server-side redaction, tails vs the store, the long-poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import Job, JobSpec, JobState, LogLine
from gpulayer_kernel.contracts.jobs import CommandWorkload
from gpulayer_kernel.controlplane import logs
from gpulayer_kernel.controlplane.logs import PAGE_BYTES, TAIL_BYTES, LogTails, record_size
from gpulayer_kernel.controlplane.signals import Signals
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.redact import Redactor
from gpulayer_kernel.store import SqliteStore
from gpulayer_kernel.testing import FakeClock

JOB = Job(id="j" * 12, seq=1, spec=JobSpec(workload=CommandWorkload(argv=["true"])), submitted_at=0)


class Tails:
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.clock = FakeClock()
        self.signals = Signals(self.clock)
        self.woken: list[str] = []
        self.redactor = Redactor()
        self.tails = LogTails(
            store, self.redactor, wake=self.wake, changed=self.signals.wait, clock=self.clock
        )
        self.job = JOB

    def wake(self, job_id: str) -> None:
        self.woken.append(job_id)
        self.signals.fire(job_id)

    async def current(self) -> Job:
        return self.job

    async def say(self, *texts: str) -> int:
        lines = [LogLine(time=0.0, stream="stdout", text=t) for t in texts]
        return await self.tails.append(JOB.id, lines)


@pytest.fixture
async def t(tmp_path: Path) -> AsyncIterator[Tails]:
    store = SqliteStore(tmp_path / "logs.db")
    await store.open()
    yield Tails(store)
    await store.close()


async def test_lines_are_numbered_redacted_stored_and_wake_the_job(t: Tails) -> None:
    t.tails.open(JOB.id)
    t.redactor.add("HF_TOKEN", "hf_secret_value")
    assert await t.say("one", "token hf_secret_value") == 2
    assert await t.tails.system(JOB.id, "placed") == 3
    page = await t.tails.page(JOB.id, t.current)
    assert [(r.seq, r.stream, r.text) for r in page.records] == [
        (1, "stdout", "one"),
        (2, "stdout", "token ***"),
        (3, "system", "placed"),
    ]
    assert [r.text for r in await t.store.read_logs(JOB.id, 0, 10)][1] == "token ***"
    assert t.woken == [JOB.id, JOB.id]
    assert await t.tails.append(JOB.id, []) == 3


async def test_a_forgotten_tail_counts_on_from_the_store(t: Tails) -> None:
    t.tails.open(JOB.id)
    await t.say("a", "b")
    t.tails.forget(JOB.id)
    assert await t.say("c") == 3
    assert [r.text for r in await t.tails.read(JOB.id, 1, 10)] == ["b", "c"]


async def test_an_ended_jobs_tail_stays_for_the_readers_its_end_woke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "ENDED_TAILS", 2)
    store = SqliteStore(tmp_path / "ended.db")
    await store.open()
    t = Tails(store)
    jobs = ["a" * 12, "b" * 12, "c" * 12]
    for job in jobs:
        t.tails.open(job)
        await t.tails.append(job, [LogLine(time=0.0, stream="stdout", text=job[0])])
        t.tails.forget(job)
    assert t.tails.held == 0 and 0 < t.tails.ended_held
    await store.close()
    # The last two ended are read with no store at all (a waiter's page right after the end).
    for job in jobs[1:]:
        assert [r.text for r in await t.tails.read(job, 0, 10)] == [job[0]]
    with pytest.raises(GPUlayerError):  # the oldest went: its lines are the store's
        await t.tails.read(jobs[0], 0, 10)


async def test_a_late_line_after_the_end_is_read_with_the_rest_from_the_store(t: Tails) -> None:
    t.tails.open(JOB.id)
    await t.say("a")
    t.tails.forget(JOB.id)
    await t.say("late: a cancel's note")
    assert [r.text for r in await t.tails.read(JOB.id, 0, 10)] == ["a", "late: a cancel's note"]
    assert t.tails.ended_held == 0


async def test_a_long_tail_keeps_its_newest_lines_and_reads_older_ones_from_the_store(
    t: Tails,
) -> None:
    t.tails.open(JOB.id)
    piece = "y" * (64 << 10)  # a piece of a long line, as a worker ships it
    n = 2 * TAIL_BYTES // len(piece)
    await t.say(*(f"{i} {piece}" for i in range(n)))
    assert t.tails.held <= TAIL_BYTES  # bytes, not a count of records (issue 32)
    first = await t.tails.read(JOB.id, 0, 3)
    assert [r.seq for r in first] == [1, 2, 3]  # from the store
    last = await t.tails.read(JOB.id, n - 2, 5)
    assert [r.seq for r in last] == [n - 1, n]
    assert sum(record_size(r) for r in await t.tails.read(JOB.id, 0, 5000)) <= PAGE_BYTES + (
        100 << 10
    )


async def test_every_tail_together_stays_under_its_bound(
    t: Tails, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "TAILS_BYTES", 8 << 20)
    emoji = "\U0001f600" * (16 << 10)  # 64 KiB of text, 4 bytes a character in memory
    jobs = [f"j{i:011d}" for i in range(12)]
    for job in jobs:
        t.tails.open(job)
        lines = [LogLine(time=0.0, stream="stdout", text=emoji) for _ in range(20)]
        await t.tails.append(job, lines)
        assert t.tails.held <= (8 << 20) + 20 * record_size((await t.tails.read(job, 0, 1))[0])
    assert t.tails.held <= 8 << 20
    for job in jobs:  # nothing is lost: what left memory is read from the store, page by page
        seqs: list[int] = []
        while page := await t.tails.read(job, seqs[-1] if seqs else 0, 100):
            seqs += [r.seq for r in page]
        assert seqs == list(range(1, 21))
        t.tails.forget(job)
    assert t.tails.held == 0 and t.tails.ended_held <= logs.ENDED_BYTES


async def test_a_page_of_big_records_is_cut_by_bytes_and_says_more(t: Tails) -> None:
    t.tails.open(JOB.id)
    big = "z" * (1 << 20)
    await t.say(big, big, big, big, big, big)
    records, more = await t.tails.read_more(JOB.id, 0, 5000)
    assert 1 <= len(records) < 6 and more
    records, more = await t.tails.read_more(JOB.id, 5, 5000)
    assert [r.seq for r in records] == [6] and not more


async def test_the_long_poll_waits_for_a_line_or_the_clock(t: Tails) -> None:
    t.tails.open(JOB.id)
    poll = asyncio.ensure_future(t.tails.page(JOB.id, t.current, since=0, wait=20))
    await t.clock.advance(19)
    assert not poll.done()
    await t.clock.advance(1)
    assert (await poll).records == []
    poll = asyncio.ensure_future(t.tails.page(JOB.id, t.current, since=0, wait=20))
    await t.clock.advance(5)
    await t.say("late")
    page = await poll
    assert [r.text for r in page.records] == ["late"] and page.next_since == 1


async def test_the_long_poll_of_a_finished_job_answers_at_once(t: Tails) -> None:
    t.job = JOB.model_copy(update={"state": JobState.SUCCEEDED})
    page = await t.tails.page(JOB.id, t.current, since=0, wait=20)
    assert page.records == [] and page.state == JobState.SUCCEEDED
