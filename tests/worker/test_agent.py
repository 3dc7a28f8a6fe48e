"""The worker agent waits on its clock: heartbeats and reconnect backoff take no real seconds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    Work,
    WorkerInfo,
    WorkerRegistration,
)
from gpulayer_kernel.errors import NotFound, Unavailable
from gpulayer_kernel.testing import FakeClock, NullTransport
from gpulayer_kernel.worker import agent as agent_module
from gpulayer_kernel.worker.agent import WorkerAgent
from gpulayer_kernel.worker.backoff import backoff
from gpulayer_kernel.worker.config import ExecutorConfig


class ScriptedTransport(NullTransport):
    """A control plane that only counts: long-polls run out on the fake clock with no work.

    ``poll_errors`` and ``join_errors`` are raised, in order, by the next polls and joins.
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.heartbeats: list[float] = []
        self.polls: list[float] = []
        self.joins: list[float] = []
        self.poll_errors: list[Exception] = []
        self.join_errors: list[Exception] = []

    async def register(self, reg: WorkerRegistration) -> WorkerInfo:
        self.joins.append(self.clock.monotonic())
        if self.join_errors:
            raise self.join_errors.pop(0)
        return await super().register(reg)

    async def heartbeat(self) -> None:
        self.heartbeats.append(self.clock.monotonic())

    async def next_work(self, wait: float) -> Work:
        self.polls.append(self.clock.monotonic())
        if self.poll_errors:
            raise self.poll_errors.pop(0)
        return await super().next_work(wait)


Start = Callable[[ScriptedTransport], Awaitable[WorkerAgent]]


@pytest.fixture
async def start_agent(gl_fake_clock: FakeClock, tmp_path: Path) -> AsyncIterator[Start]:
    agents: list[WorkerAgent] = []

    async def start(transport: ScriptedTransport) -> WorkerAgent:
        agent = WorkerAgent(
            transport,
            WorkerRegistration(name="w"),
            ExecutorConfig(work_root=tmp_path / "work"),
            clock=gl_fake_clock,
            heartbeat_interval=5.0,
            poll_wait=25.0,
        )
        await agent.start()
        agents.append(agent)
        await gl_fake_clock.advance(0)  # let its loops reach their first wait
        return agent

    yield start
    for agent in agents:
        await agent.stop()


async def test_heartbeats_are_sent_as_the_clock_advances_and_only_then(
    gl_fake_clock: FakeClock, start_agent: Start
) -> None:
    t = ScriptedTransport(gl_fake_clock)
    await start_agent(t)
    assert t.heartbeats == []  # no time has passed: nothing sent
    await gl_fake_clock.advance(4.9)
    assert t.heartbeats == []
    await gl_fake_clock.advance(0.1)
    assert t.heartbeats == [5.0]
    await gl_fake_clock.advance(15.0)
    assert t.heartbeats == [5.0, 10.0, 15.0, 20.0]
    assert t.polls == [0.0]  # the long-poll is still out (25 s)
    await gl_fake_clock.advance(5.0)
    assert t.polls == [0.0, 25.0]  # it ran out with no work: the next one went out at once


@pytest.fixture
def jitter_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff without its random jitter, in exact binary fractions: 0.25 s, 0.5 s, 1 s, …"""
    monkeypatch.setattr(agent_module, "backoff", lambda attempt: 0.25 * 2**attempt)


def test_backoff_grows_to_its_cap_with_full_jitter() -> None:
    for attempt, cap in [(0, 0.2), (1, 0.4), (3, 1.6), (10, 10.0)]:
        assert all(0.0 <= backoff(attempt) <= cap for _ in range(50))


async def test_polling_backs_off_after_transport_errors(
    gl_fake_clock: FakeClock, start_agent: Start, jitter_free: None
) -> None:
    t = ScriptedTransport(gl_fake_clock)
    t.poll_errors = [Unavailable("restarting") for _ in range(3)]
    await start_agent(t)
    assert t.polls == [0.0]  # failed; the agent now waits before it asks again
    await gl_fake_clock.advance(0.125)
    assert t.polls == [0.0]
    await gl_fake_clock.advance(0.125)
    assert t.polls == [0.0, 0.25]
    await gl_fake_clock.advance(0.5 + 1.0)
    assert t.polls == [0.0, 0.25, 0.75, 1.75]  # each wait twice the last
    assert not t.poll_errors  # the fourth poll went out and is waiting for work
    await gl_fake_clock.advance(3.25)
    assert t.heartbeats == [5.0]  # heartbeats kept their own cadence meanwhile


async def test_a_worker_the_control_plane_forgot_rejoins_with_backoff(
    gl_fake_clock: FakeClock, start_agent: Start, jitter_free: None
) -> None:
    t = ScriptedTransport(gl_fake_clock)
    t.poll_errors = [NotFound("no such worker")]
    await start_agent(t)
    assert t.joins == [0.0, 0.0]  # joined, then re-joined at once when forgotten
    t.poll_errors = [NotFound("no such worker")]
    t.join_errors = [Unavailable("restarting")]
    await gl_fake_clock.advance(25.0)  # the pending long-poll runs out; the next one is refused
    assert len(t.joins) == 3  # the re-join failed: it backs off before trying again
    await gl_fake_clock.advance(0.125)
    assert len(t.joins) == 3
    await gl_fake_clock.advance(0.125)
    assert t.joins[3:] == [25.25] and len(t.polls) == 4
