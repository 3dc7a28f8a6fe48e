"""A GPU kernel's lanes on their own (issue 33): bounded in bytes, per lane and all together, the
up lane shedding old output (never replies), a message that can never fit refused, and every
byte freed by an acknowledgement or a clear."""

from __future__ import annotations

import asyncio

import pytest

from gpulayer_kernel.contracts.kernels import MAX_MESSAGE, WAITING_BYTES
from gpulayer_kernel.controlplane.sessions.lanes import Budget, Lane
from gpulayer_kernel.errors import Busy, TooLarge
from gpulayer_kernel.testing import FakeClock
from gpulayer_kernel.wire.kernels import KernelMessage, decode, encode


def msg(channel: str, size: int) -> KernelMessage:
    return KernelMessage(channel, [b"x" * size])  # type: ignore[arg-type]


def lane(limit: int = 1000, budget: Budget | None = None) -> Lane:
    return Lane(FakeClock(), budget or Budget(10_000), seq=100, limit=limit)


async def test_a_lane_holds_its_bytes_then_says_busy_and_frees_on_ack() -> None:
    a = lane()
    a.put([msg("shell", 400), msg("shell", 400)])
    with pytest.raises(Busy) as err:
        a.put([msg("shell", 400)])
    assert err.value.status == 429 and err.value.code == "kernel_lane_full"
    assert [s for s, _ in a.after(100)] == [101, 102] and a.size == 800
    a.ack(101)
    a.put([msg("shell", 400)])
    assert [s for s, _ in a.after(101)] == [102, 103] and a.budget.used == 800
    a.clear()
    assert a.size == 0 and a.budget.used == 0 and a.after(0) == []


async def test_one_big_message_passes_an_empty_lane_alone() -> None:
    a = lane(limit=100)
    a.put([msg("shell", 500)])  # a big widget value: it travels, alone
    with pytest.raises(Busy):
        a.put([msg("shell", 1)])
    a.check(msg("shell", MAX_MESSAGE), "the relay")
    with pytest.raises(TooLarge) as err:
        a.check(msg("shell", MAX_MESSAGE + 1), "the relay")
    assert err.value.code == "kernel_message_too_large"


async def test_a_waiting_kernels_lane_takes_no_message_over_its_small_buffer() -> None:
    waiting = lane(limit=WAITING_BYTES)
    with pytest.raises(TooLarge) as err:
        waiting.check(msg("shell", WAITING_BYTES + 1), "a kernel that is not up yet", most=1 << 20)
    assert "not up yet" in err.value.message and "queued or starting" in err.value.hint


async def test_every_lane_together_is_bounded() -> None:
    budget = Budget(1000)
    a, b = lane(budget=budget), lane(budget=budget)
    a.put([msg("shell", 600)])
    with pytest.raises(Busy):
        b.put([msg("shell", 600)])
    a.ack(101)
    b.put([msg("shell", 600)])
    assert budget.used == 600


async def test_the_up_lane_sheds_its_oldest_output_never_a_reply() -> None:
    up = lane(limit=1000)
    up.put([msg("shell", 300), msg("iopub", 300), msg("iopub", 300)])
    up.put([msg("iopub", 300)], shed_iopub=True)  # the oldest iopub gives way
    assert [(m.channel, s) for s, m in up.after(0)] == [
        ("shell", 101),
        ("iopub", 103),
        ("iopub", 104),
    ]
    assert up.dropped == 1
    with pytest.raises(Busy):  # only replies and new output left: the reply is never shed
        up.put([msg("shell", 900)], shed_iopub=True)


async def test_a_writer_waits_for_room_until_the_reader_acknowledges() -> None:
    a = lane(limit=500)
    a.put([msg("shell", 400)])
    waiting = asyncio.ensure_future(a.room(400, None))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not waiting.done()
    a.ack(101)
    assert await waiting


def test_a_stream_message_round_trips_and_a_malformed_one_is_refused() -> None:
    m = KernelMessage("iopub", [b"id", b"<IDS|MSG>", b"sig", b"{}", b"{}", b"{}", b"", b"\x00"])
    seq, back = decode(encode(7, m))
    assert seq == 7 and back.channel == "iopub" and back.parts == m.parts
    with pytest.raises(ValueError):
        decode(encode(7, m)[:-1])
    with pytest.raises(ValueError):
        decode(b"A\x00")
