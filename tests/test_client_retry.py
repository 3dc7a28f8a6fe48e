"""The client's retries of keyed writes (ADR 0003, ``ha/failover.py``), against a real server.

THE crash case: a real ``gpulayer serve`` is SIGKILLed at random moments while clients submit
(one job a call, and batches) with their keys, and restarted on the same port and home; each
call rides the restart out (retrying with the same key) and the store ends with exactly one
job per submitted spec, each the one its call was answered with (``POST /jobs``, ``/jobs/run``
and ``/jobs/batch``). Below it, the retry rule
itself: which outcomes are sent again, with one URL and with several.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel.client.clients import AsyncClient, Client
from gpulayer_kernel.contracts import CommandWorkload, Job, JobSpec
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.ha.failover import Servers
from gpulayer_kernel.testing import until, wait_until
from gpulayer_kernel.testing.processes import ServeProcess


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, workload=CommandWorkload(argv=["true"]))


@pytest.mark.slow
def test_submits_through_repeated_kill_9_make_exactly_one_job_each(tmp_path: Path) -> None:
    rng = random.Random(23)
    with ServeProcess(tmp_path / "home") as server:
        answered: dict[str, str] = {}  # spec name -> the job id its call was answered with
        errors: list[BaseException] = []
        stop = threading.Event()

        def submitter(me: int) -> None:
            with Client(server.url, server.admin_token) as c:
                n = 0
                while not stop.is_set():
                    try:
                        if me == 0:  # a batch of three, one call
                            names = [f"b{me}-{n}-{i}" for i in range(3)]
                            jobs = c.submit_many([spec(x) for x in names])
                            for x, j in zip(names, jobs, strict=True):
                                assert isinstance(j, Job), j
                                answered[x] = j.id
                        elif me == 1:  # submit and follow in one request (/jobs/run)
                            answered[f"r{me}-{n}"] = c.run(spec(f"r{me}-{n}")).job.id
                        else:
                            answered[f"s{me}-{n}"] = c.submit(spec(f"s{me}-{n}")).id
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    n += 1

        threads = [threading.Thread(target=submitter, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        try:
            for _ in range(4):  # kills at random moments of the submit loop
                time.sleep(rng.uniform(0.2, 0.8))
                server.restart(kill=True)
            # Calls are answered again after the last kill (or a submitter gave up: said below).
            after = len(answered)
            wait_until(lambda: len(answered) >= after + 4 or errors, 60, what="answers again")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert not errors, errors
        one_job_each(server, answered, len(threads))


def one_job_each(server: ServeProcess, answered: dict[str, str], callers: int) -> None:
    """The store holds exactly one job a submitted spec, the one its call was answered with."""
    with server.client() as c:
        stored = c.list(limit=10_000)
    by_name: dict[str, list[str]] = {}
    for job in stored:
        by_name.setdefault(job.spec.name, []).append(job.id)
    twice = {name: ids for name, ids in by_name.items() if len(ids) > 1}
    assert not twice, f"made twice: {twice}"
    assert len(answered) > 20  # the loop really ran across the kills
    # Every answered call's job is stored, and is the one the store holds for its spec
    # (a job stored but never answered can only be of the calls cut off by `stop`).
    assert {n: [i] for n, i in answered.items()} == {n: by_name[n] for n in answered}
    assert len(stored) - len(answered) <= 3 * callers


def test_a_lone_server_that_is_down_is_retried_for_a_bounded_time(tmp_path: Path) -> None:
    # Nothing listens there: a keyed write tries for `failover_for`, then says unreachable;
    # a read (no key) says so at once, as before.
    with Client("http://127.0.0.1:9") as c:
        c.servers.failover_for = 1.0
        began = time.monotonic()
        with pytest.raises(GPUlayerError) as info:
            c.submit(spec("never"))
        assert info.value.code == "server_unreachable"
        assert 1.0 <= time.monotonic() - began < 5.0
        began = time.monotonic()
        with pytest.raises(GPUlayerError):
            c.get("abcd")
        assert time.monotonic() - began < 1.0


def _resp(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": "m"})


@pytest.mark.parametrize(
    ("urls", "method", "keyed", "outcome", "again"),
    [
        # One URL: only a keyed write is sent again, on what a restart looks like.
        ("http://a", "POST", True, httpx.ConnectError("refused"), True),
        ("http://a", "POST", True, httpx.RemoteProtocolError("cut mid-way"), True),
        ("http://a", "POST", True, httpx.ReadTimeout("slow"), True),
        ("http://a", "POST", True, _resp(503, "starting"), True),
        ("http://a", "POST", True, _resp(503, "store_unavailable"), True),
        ("http://a", "POST", True, _resp(503, "not_leader"), False),
        ("http://a", "POST", True, _resp(409, "conflict"), False),
        ("http://a", "POST", False, httpx.ConnectError("refused"), False),
        ("http://a", "GET", False, httpx.ConnectError("refused"), False),
        # Several: as before, and a keyed POST cut mid-way counts as repeatable.
        ("http://a,http://b", "POST", True, httpx.RemoteProtocolError("cut"), True),
        ("http://a,http://b", "POST", False, httpx.RemoteProtocolError("cut"), False),
        ("http://a,http://b", "POST", False, httpx.ConnectError("refused"), True),
        ("http://a,http://b", "POST", True, _resp(503, "busy"), True),
        ("http://a,http://b", "POST", False, _resp(503, "busy"), False),
        ("http://a,http://b", "GET", False, _resp(503, "not_leader"), True),
    ],
)
def test_which_outcomes_send_a_request_again(
    urls: str, method: str, keyed: bool, outcome: BaseException | httpx.Response, again: bool
) -> None:
    assert Servers(urls).moves_on(method, outcome, keyed=keyed) is again


@pytest.mark.slow
async def test_tunnelled_submits_through_repeated_kill_9_make_exactly_one_job_each(
    tmp_path: Path,
) -> None:
    """The same with ``AsyncClient``s on the client tunnel: a kill cuts the tunnel with requests
    on it (``httpx.ReadError``, as a dropped HTTP connection), the keyed ones are sent again
    (over HTTP while the tunnel is down), and each client's tunnel opens again once the server
    is back."""
    rng = random.Random(29)
    with ServeProcess(tmp_path / "home") as server:
        answered: dict[str, str] = {}
        errors: list[BaseException] = []
        stop = asyncio.Event()
        clients = [AsyncClient(server.url, server.admin_token) for _ in range(3)]

        async def submitter(me: int, c: AsyncClient) -> None:
            n = 0
            while not stop.is_set():
                try:
                    if me == 0:
                        names = [f"b{me}-{n}-{i}" for i in range(3)]
                        jobs = await c.submit_many([spec(x) for x in names])
                        for x, j in zip(names, jobs, strict=True):
                            assert isinstance(j, Job), j
                            answered[x] = j.id
                    elif me == 1:
                        answered[f"r{me}-{n}"] = (await c.run(spec(f"r{me}-{n}"))).job.id
                    else:
                        answered[f"s{me}-{n}"] = (await c.submit(spec(f"s{me}-{n}"))).id
                except BaseException as exc:
                    errors.append(exc)
                    return
                n += 1

        def on_tunnel() -> int:
            return sum(t.answered for c in clients for t in c.wire._tunnels.values())

        tasks = [asyncio.ensure_future(submitter(i, c)) for i, c in enumerate(clients)]
        try:
            for _ in range(4):
                await asyncio.sleep(rng.uniform(0.3, 0.9))
                await asyncio.to_thread(server.restart, kill=True)
            after, tunnelled = len(answered), on_tunnel()
            await until(
                lambda: (len(answered) >= after + 6 and on_tunnel() > tunnelled) or errors,
                60,
                what="answers on the tunnels again",
            )
        finally:
            stop.set()
            await asyncio.wait(tasks, timeout=60)
            for c in clients:
                await c.aclose()
        assert not errors, errors
        one_job_each(server, answered, len(clients))
