"""The log shipper under volume: caps with one note, pieces of long lines, and backpressure that
keeps the worker's memory bounded (worker/logship.py, contracts/limits.py)."""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_kernel.contracts import LogLine
from gpulayer_kernel.contracts.limits import (
    BACKLOG_LINES,
    CELL_OUTPUT_CAP,
    CELL_OUTPUT_LINES,
    LINE_PIECE,
    dropped_note,
)
from gpulayer_kernel.redact import Redactor
from gpulayer_kernel.worker.logship import LogShipper, pump_stream


def queued_shipper(
    cap: int = 1 << 20,
) -> tuple[LogShipper, list[list[LogLine]], list[asyncio.Future[None]]]:
    handed: list[list[LogLine]] = []
    waits: list[asyncio.Future[None]] = []

    def queue(lines: list[LogLine]) -> asyncio.Future[None]:
        handed.append(lines)
        waits.append(asyncio.get_running_loop().create_future())
        return waits[-1]

    async def never(_: list[LogLine]) -> None:
        raise AssertionError("queue mode sends nothing itself")

    return LogShipper(never, Redactor({}), queue=queue, cap=cap), handed, waits


async def test_a_job_past_its_cap_keeps_the_first_lines_and_one_note() -> None:
    shipper, handed, _ = queued_shipper(cap=1000)
    for i in range(300):
        shipper.add("stdout", f"{i:09d}")  # 9 bytes each: 111 fit in 1000
    shipper.add("system", "a worker note is never dropped")
    await shipper.close()
    lines = [x for batch in handed for x in batch]
    texts = [x.text for x in lines]
    assert texts[:111] == [f"{i:09d}" for i in range(111)] and texts[111:] == [
        "a worker note is never dropped",
        dropped_note(189, 189 * 9, 1000, "this job's log"),
    ]
    assert lines[-1].stream == "system"


async def test_a_cell_is_capped_on_its_own_and_its_note_counts_the_rank_s_drops() -> None:
    shipper, handed, _ = queued_shipper()
    for _ in range(CELL_OUTPUT_LINES + 5):
        shipper.add("stdout", "x", cell=3)
    shipper.add("stdout", "other cell", cell=4)
    note = shipper.note(3, (10, 2_000))
    assert note is not None and note.cell == 3 and note.stream == "system"
    assert note.text.startswith("[gpulayer] 15 lines (2.0 KiB") or "15 lines" in note.text
    assert "capped at" in note.text and f"{CELL_OUTPUT_LINES:,} lines" in note.text
    assert shipper.note(4) is None  # cell 4 kept everything
    await shipper.close()
    kept = [x for batch in handed for x in batch]
    assert sum(1 for x in kept if x.cell == 3) == CELL_OUTPUT_LINES
    assert CELL_OUTPUT_CAP > CELL_OUTPUT_LINES  # the line count is the cap that bit here


async def test_a_long_line_goes_in_pieces() -> None:
    shipper, handed, _ = queued_shipper(cap=1 << 30)
    shipper.add("stdout", "ab" * LINE_PIECE)
    await shipper.close()
    texts = [x.text for batch in handed for x in batch]
    assert [len(t) for t in texts] == [LINE_PIECE, LINE_PIECE] and "".join(
        texts
    ) == "ab" * LINE_PIECE


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
async def test_reading_a_pipe_waits_while_the_backlog_is_full() -> None:
    shipper, handed, waits = queued_shipper(cap=1 << 30)
    n = BACKLOG_LINES * 3
    reader = asyncio.StreamReader(limit=1 << 20)
    reader.feed_data(b"".join(b"%d\n" % i for i in range(n)))
    reader.feed_eof()
    pump = asyncio.create_task(pump_stream(reader, "stdout", shipper))
    for _ in range(200):
        await asyncio.sleep(0)
    held = sum(map(len, handed))
    assert not pump.done() and BACKLOG_LINES < held < BACKLOG_LINES + 20_000, held
    # The control plane takes them: reading goes on, to the end.
    while not pump.done():
        for w in waits:
            if not w.done():
                w.set_result(None)
        await asyncio.sleep(0)
    await shipper.close()
    assert [x.text for batch in handed for x in batch] == [str(i) for i in range(n)]


async def test_unblock_lets_a_finished_job_s_pipe_be_read_at_once() -> None:
    shipper, handed, _ = queued_shipper(cap=1 << 30)
    reader = asyncio.StreamReader(limit=1 << 20)
    reader.feed_data(b"x\n" * (BACKLOG_LINES * 2))
    reader.feed_eof()
    pump = asyncio.create_task(pump_stream(reader, "stdout", shipper))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not pump.done()
    shipper.unblock()
    await asyncio.wait_for(pump, 10)
    assert sum(map(len, handed)) + len(shipper._turn) == BACKLOG_LINES * 2
