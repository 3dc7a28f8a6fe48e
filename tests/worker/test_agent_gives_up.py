"""The worker's loops retry what passes and stop, saying why, on what does not (issue 32, item 10).

They used to back off forever on any exception: a 4xx refusal, a ``TypeError``, and a re-join
whose token was revoked (an SSH machine's worker looped ``_rejoin failed (token … revoked)``
forever, with nothing logged at error). Heartbeat failures were suppressed silently.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import Work, WorkerInfo, WorkerRegistration
from gpulayer_kernel.errors import Forbidden, InvalidInput, Unauthorized, Unavailable
from gpulayer_kernel.testing import FakeClock, NullTransport, until
from gpulayer_kernel.worker import agent as agent_module
from gpulayer_kernel.worker.agent import WorkerAgent, transient
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.http import HttpTransport

from ..api.conftest import start_api, stop_api


class Scripted(NullTransport):
    """Raises the queued errors from the next polls, joins and heartbeats, in order."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.polls = 0
        self.joins = 0
        self.poll_errors: list[BaseException] = []
        self.join_errors: list[BaseException] = []
        self.beat_errors: list[BaseException] = []

    async def register(self, reg: WorkerRegistration) -> WorkerInfo:
        self.joins += 1
        if self.join_errors:
            raise self.join_errors.pop(0)
        return await super().register(reg)

    async def heartbeat(self) -> None:
        if self.beat_errors:
            raise self.beat_errors.pop(0)

    async def next_work(self, wait: float) -> Work:
        self.polls += 1
        if self.poll_errors:
            raise self.poll_errors.pop(0)
        return await super().next_work(wait)


Start = Callable[[Scripted], Awaitable[WorkerAgent]]


@pytest.fixture
async def start(
    gl_fake_clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Start]:
    monkeypatch.setattr(agent_module, "backoff", lambda attempt: 0.25 * 2**attempt)
    agents: list[WorkerAgent] = []

    async def go(t: Scripted) -> WorkerAgent:
        agent = WorkerAgent(
            t,
            WorkerRegistration(name="w"),
            ExecutorConfig(work_root=tmp_path / "work"),
            clock=gl_fake_clock,
            heartbeat_interval=5.0,
            poll_wait=25.0,
        )
        await agent.start()
        agents.append(agent)
        await gl_fake_clock.advance(0)
        return agent

    yield go
    for agent in agents:
        await agent.stop()


def test_what_is_transient() -> None:
    assert transient(Unavailable("restarting")) and transient(TimeoutError())
    assert transient(ConnectionResetError())
    for exc in (InvalidInput("bad"), Forbidden("no"), Unauthorized("revoked"), TypeError("x")):
        assert not transient(exc), exc


@pytest.mark.parametrize(
    "refusal", [InvalidInput("protocol 2.0 is not spoken here"), TypeError("a bug")]
)
async def test_a_refused_or_broken_poll_stops_the_worker_saying_why(
    gl_fake_clock: FakeClock, start: Start, refusal: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    t = Scripted(gl_fake_clock)
    t.poll_errors = [refusal]
    agent = await start(t)
    await gl_fake_clock.advance(120.0)
    assert t.polls == 1  # not retried every few seconds forever
    assert agent.fatal is not None and str(refusal) in agent.fatal
    await agent.wait()  # the loops ended: `gpulayer worker` leaves and exits 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "this worker stops" in errors[0].getMessage()
    if isinstance(refusal, TypeError):
        assert errors[0].exc_info is not None  # a bug gets its traceback


async def test_a_rejoin_whose_token_was_revoked_stops_the_worker(
    gl_fake_clock: FakeClock, start: Start
) -> None:
    t = Scripted(gl_fake_clock)
    agent = await start(t)
    t.poll_errors = [Unauthorized("session ended")]
    t.join_errors = [Unavailable("restarting"), Unauthorized("token glt_x was revoked")]
    await gl_fake_clock.advance(25.0)  # the pending long-poll runs out; the next one is refused
    await gl_fake_clock.advance(5.0)
    assert t.joins == 3  # joined; re-join failed transiently (retried), then refused
    await gl_fake_clock.advance(600.0)
    assert t.joins == 3 and t.polls == 2  # and nothing was tried again
    assert agent.fatal is not None and "revoked" in agent.fatal
    await agent.wait()


async def test_transient_poll_failures_are_still_retried(
    gl_fake_clock: FakeClock, start: Start
) -> None:
    t = Scripted(gl_fake_clock)
    t.poll_errors = [Unavailable("restarting"), ConnectionResetError("reset")]
    agent = await start(t)
    await gl_fake_clock.advance(1.0)
    assert t.polls == 3 and agent.fatal is None


async def test_heartbeat_failures_are_logged_once_per_run(
    gl_fake_clock: FakeClock, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpulayer.worker")
    t = Scripted(gl_fake_clock)
    t.beat_errors = [Unavailable("restarting")] * 3
    agent = await start(t)
    await gl_fake_clock.advance(20.0)
    said = [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]
    assert said[0].startswith("heartbeat failed (") and "restarting" in said[0]
    assert sum("heartbeat failed" in m for m in said) == 1  # once, not every 5 s
    assert "heartbeats are answered again" in said[-1]
    assert agent.fatal is None


async def test_a_real_worker_whose_tokens_were_revoked_stops(tmp_path: Path) -> None:
    """Over HTTP against a real server: every token of the worker revoked (as when its machine
    was ended), the next poll is refused, the re-join too, and the worker stops."""
    api = await start_api(tmp_path, heartbeat_timeout=5.0)
    t = HttpTransport(api.url, api.join_token, retry_for=5)
    agent = WorkerAgent(
        t,
        WorkerRegistration(name="wx"),
        ExecutorConfig(work_root=tmp_path / "work"),
        heartbeat_interval=0.5,
        poll_wait=0.5,
    )
    try:
        await agent.start()
        await api.tokens.revoke_where(lambda r: r.kind in ("join", "worker"))
        await until(lambda: agent.fatal is not None, 10, what="the worker to give up")
        assert "re-joining the control plane was refused" in str(agent.fatal), agent.fatal
        await agent.wait()
    finally:
        await agent.stop()
        await stop_api(api)
