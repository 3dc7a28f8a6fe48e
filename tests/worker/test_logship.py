"""The log shipper: batching, retry backoff on its clock, and giving up on a job that ended."""

from __future__ import annotations

from gpulayer_kernel.contracts import LogLine
from gpulayer_kernel.errors import Conflict, Unavailable
from gpulayer_kernel.redact import Redactor
from gpulayer_kernel.testing import FakeClock, until
from gpulayer_kernel.worker.logship import ATTEMPTS, LogShipper


class Sink:
    """A ``send`` that fails with the queued errors first, and records when each call came."""

    def __init__(self, clock: FakeClock, errors: list[Exception] | None = None) -> None:
        self.clock = clock
        self.errors = errors or []
        self.calls: list[float] = []
        self.lines: list[LogLine] = []

    async def __call__(self, lines: list[LogLine]) -> None:
        self.calls.append(self.clock.monotonic())
        if self.errors:
            raise self.errors.pop(0)
        self.lines.extend(lines)


async def test_a_failed_send_is_retried_after_a_doubling_backoff(gl_fake_clock: FakeClock) -> None:
    sink = Sink(gl_fake_clock, [Unavailable("restarting"), Unavailable("restarting")])
    shipper = LogShipper(
        sink, Redactor({"TOKEN": "s3cret"}), flush_interval=0.5, clock=gl_fake_clock
    )
    shipper.add("stdout", "token is s3cret")
    await until(lambda: sink.calls, what="the first send")
    await gl_fake_clock.advance(0.25)
    assert sink.calls == [0.0]  # no retry before the backoff ends
    await gl_fake_clock.advance(0.25)
    assert sink.calls == [0.0, 0.5]
    await gl_fake_clock.advance(0.75)
    assert sink.calls == [0.0, 0.5]
    await gl_fake_clock.advance(0.25)
    assert sink.calls == [0.0, 0.5, 1.5]  # twice the last wait
    [line] = sink.lines
    assert (
        line.text == "token is ***" and line.time == gl_fake_clock.now() - 1.5
    )  # stamped when added
    await shipper.close()
    assert (shipper.sent, shipper.dropped) == (1, 0)


async def test_a_batch_is_dropped_after_its_last_attempt(gl_fake_clock: FakeClock) -> None:
    sink = Sink(gl_fake_clock, [Unavailable("down") for _ in range(ATTEMPTS)])
    shipper = LogShipper(sink, Redactor(), flush_interval=0.5, clock=gl_fake_clock)
    shipper.add("stderr", "lost")
    await until(lambda: sink.calls, what="the first send")
    await gl_fake_clock.advance(60.0)
    assert sink.calls == [0.0, 0.5, 1.5, 3.5, 5.5]  # backoff capped at 2 s
    await shipper.close()
    assert (shipper.sent, shipper.dropped, sink.lines) == (0, 1, [])


async def test_lines_of_a_job_that_ended_are_not_retried(gl_fake_clock: FakeClock) -> None:
    sink = Sink(gl_fake_clock, [Conflict("the job has ended")])
    shipper = LogShipper(sink, Redactor(), clock=gl_fake_clock)
    shipper.add("stdout", "late")
    await shipper.close()  # returns without the gl_fake_clock moving: nothing to wait for
    assert (sink.calls, shipper.dropped) == ([0.0], 1)
    assert gl_fake_clock.pending == 0


async def test_a_send_that_hangs_times_out_on_the_clock(gl_fake_clock: FakeClock) -> None:
    calls: list[float] = []

    async def hang(lines: list[LogLine]) -> None:
        calls.append(gl_fake_clock.monotonic())
        if len(calls) == 1:
            await gl_fake_clock.sleep(3600)  # a request that never answers

    shipper = LogShipper(hang, Redactor(), flush_interval=0.5, clock=gl_fake_clock)
    shipper.add("stdout", "slow")
    await until(lambda: calls, what="the first send")
    await gl_fake_clock.advance(30.0)
    assert calls == [0.0]
    await gl_fake_clock.advance(0.5)
    assert calls == [0.0, 30.5]  # timed out after 30 s, retried after the first backoff
    await shipper.close()
    assert shipper.sent == 1
