"""HttpTransport's retries and long-poll deadlines run on its clock: no real seconds waited."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gpulayer_kernel.errors import Conflict, Unavailable
from gpulayer_kernel.testing import FakeClock, until
from gpulayer_kernel.worker import http as worker_http
from gpulayer_kernel.worker.http import HttpTransport

URL = "http://127.0.0.1:9"


@pytest.fixture
def exact_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff without jitter, in exact binary fractions: 0.25 s, 0.5 s, 1 s, …"""
    monkeypatch.setattr(worker_http, "backoff", lambda attempt: 0.25 * 2**attempt)


async def transport_with(clock: FakeClock, handler: httpx.MockTransport) -> HttpTransport:
    t = HttpTransport(URL, "join-token", retry_for=2.0, clock=clock)
    await t.close()
    # The server, replaced by a handler in this process (the transport's client is its own).
    t.wire._pools[t.servers.url] = httpx.AsyncClient(base_url=f"{URL}/api/v1", transport=handler)
    t.session_token = "session"
    return t


async def test_a_call_is_retried_with_backoff_until_retry_for_runs_out(
    exact_backoff: None,
) -> None:
    clock = FakeClock()
    calls: list[float] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(clock.monotonic())
        raise httpx.ConnectError("connection refused", request=request)

    t = await transport_with(clock, httpx.MockTransport(refuse))
    try:
        started = asyncio.create_task(t.report_started("job1"))
        await until(lambda: calls, what="the first request")
        await clock.advance(0.125)
        assert calls == [0.0]
        await clock.advance(0.125)
        assert calls == [0.0, 0.25]
        await clock.advance(10.0)
        assert calls == [0.0, 0.25, 0.75, 1.75, 3.75]  # the last try after retry_for (2 s)
        with pytest.raises(Unavailable):
            await started
    finally:
        await t.close()


async def test_a_rendezvous_long_poll_asks_again_until_its_deadline() -> None:
    clock = FakeClock()
    waits: list[str] = []

    async def pending(request: httpx.Request) -> httpx.Response:
        waits.append(request.url.params["wait"])
        await clock.sleep(float(request.url.params["wait"]))  # the server holds the long-poll
        return httpx.Response(
            409, json={"code": "rendezvous_pending", "message": "not yet", "hint": ""}
        )

    t = await transport_with(clock, httpx.MockTransport(pending))
    t.max_wait = 60.0
    try:
        polling = asyncio.create_task(t.get_rendezvous("job1", wait=90.0))
        await until(lambda: waits, what="the first long-poll")
        await clock.advance(59.0)
        assert waits == ["60.000"] and not polling.done()  # one long-poll caps at max_wait
        await clock.advance(1.0)
        assert waits == ["60.000", "30.000"]  # asked again for the rest of the wait
        await clock.advance(30.0)
        with pytest.raises(Conflict):
            await polling
        assert len(waits) == 2
    finally:
        await t.close()
