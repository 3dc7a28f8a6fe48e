"""Multi-node gangs: separate workers each run their share of the ranks, over loopback.

In-process workers share one ControlPlane through two ``InProcessTransport``s (each with its own
work root and advertised address). The lost-worker test runs ``gpulayer serve`` and two
``gpulayer worker`` processes for real, and SIGKILLs one of them mid-gang.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import JobState, WorkerRegistration
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, ServeProcess, WorkerProcess, until, wait_until

from ..conftest import WorkerFactory, sim_caps
from .conftest import (
    PY,
    ROOT,
    command_spec,
    lines,
    needs_torch,
    pid_alive,
    rank_pids,
    run_to_end,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    needs_torch,  # torchrun is part of torch, even where the ranks never import it
    pytest.mark.usefixtures("no_leftovers"),
    pytest.mark.skipif(sys.platform != "linux", reason="gang jobs need Linux (/proc, setpriv)"),
]


async def test_two_workers_one_rank_each_all_reduce(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(name="w1", gpus=1, advertise_addr="127.0.0.1")
    await gl_worker(name="w2", gpus=1, advertise_addr="127.0.0.1")
    spec = command_spec(["python", "examples/allreduce.py"], gpus=1, nodes=2, workdir=ROOT)
    job = await run_to_end(gl_cp, spec)
    assert job.state == JobState.SUCCEEDED, job.reason
    records = await lines(gl_cp, job.id)
    assert ("stdout", 0, "rank 0: sum = 3") in records
    assert ("stdout", 1, "rank 1: sum = 3") in records
    rdzv = [t for s, _, t in records if s == "system" and "rendezvous at" in t]
    assert len(rdzv) == 2 and {t.rsplit(" ", 1)[1] for t in rdzv} == {
        rdzv[0].rsplit(" ", 1)[1]
    }  # both nodes met at the one address rank 0 published
    assert {t.split("(")[1].split(")")[0] for t in rdzv} == {"node 0 of 2", "node 1 of 2"}


async def test_result_comes_from_rank0_and_artifacts_from_every_node(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=2)
    await gl_worker(name="w2", gpus=2)
    job = await run_to_end(gl_cp, command_spec([PY, str(scripts / "outputs.py")], gpus=2, nodes=2))
    assert job.state == JobState.SUCCEEDED, job.reason
    assert job.result == {"rank": 0, "world": 4}
    assert sorted((a.name, a.rank) for a in job.artifacts) == [
        (f"rank{r}/hello.txt", r) for r in range(4)
    ]
    assert set(rank_pids(await lines(gl_cp, job.id))) == {0, 1, 2, 3}


async def test_a_failing_rank_on_one_node_stops_the_other_node(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=1)
    await gl_worker(name="w2", gpus=1)
    spec = command_spec(
        [PY, str(scripts / "raise_rank.py")],
        gpus=1,
        nodes=2,
        retries=3,
        env={"FAIL_RANK": "1", "FAIL_AFTER": "0.5"},
    )
    job = await run_to_end(gl_cp, spec)
    assert job.state == JobState.FAILED and job.attempts == 0
    assert job.placement is not None and job.reason is not None
    node1 = next(n for n in job.placement.nodes if n.node_rank == 1)
    head = job.reason.splitlines()[0]
    assert head == f"node 1 ({node1.worker_name}): rank 1 exited with code 1; last lines of rank 1:"
    assert job.reason.endswith("ValueError: boom in rank 1")
    pids = rank_pids(await lines(gl_cp, job.id))
    assert set(pids) == {0, 1}
    # The other node's rank (asleep, on another worker) is stopped within seconds.
    await until(lambda: not any(pid_alive(p) for p in pids.values()), 10.0, what=f"{pids} gone")


async def test_a_rendezvous_that_never_completes_fails_the_job(tmp_path: Path) -> None:
    """Rank 0's worker never publishes (it never even takes the job): fail with the reason."""
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    # On a fake clock the mute workers, which never heartbeat, stay live until time is moved.
    clock = FakeClock()
    cp = ControlPlane(
        store,
        LocalArtifactStore(tmp_path / "blobs"),
        clock=clock,
        heartbeat_timeout=2.0,
        rendezvous_timeout=1.0,
    )
    await cp.start()
    ids = [
        (await cp.register(WorkerRegistration(name=n, capabilities=sim_caps(1)))).id
        for n in ("mute1", "mute2")
    ]
    try:
        job = await cp.submit(command_spec(["true"], gpus=1, nodes=2))

        async def placed() -> bool:
            return (await cp.get(job.id)).state == JobState.PLACED

        async def ended() -> bool:
            return (await cp.get(job.id)).state.terminal

        await until(placed, what="the job's placement")
        started = clock.monotonic()
        await clock.advance(1.5)  # past the rendezvous timeout, within the heartbeat timeout
        # Real seconds from here: the failure is committed by the store's writer thread.
        await until(ended, what="the job to end")
        job = await cp.get(job.id)
        assert job.state == JobState.FAILED
        assert job.reason == (
            "rendezvous did not complete within 1s: the rank-0 worker never published its address"
        )
        assert clock.monotonic() - started < 5  # it failed on the reaper's first rounds
        for wid in ids:  # every node is told to stop
            assert job.id in (await cp.next_work(wid)).cancel
    finally:
        await cp.close()
        await store.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    server = ServeProcess(tmp_path / "home", heartbeat_timeout=2)
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_worker_killed_mid_gang_stops_the_others_and_is_not_retried(
    served: ServeProcess, scripts: Path, tmp_path: Path
) -> None:
    join = await asyncio.to_thread(served.create_token, "join")
    workers = {
        name: WorkerProcess(served.url, join, name=name, simulate_gpus=1, home=tmp_path / name)
        for name in ("wa", "wb")
    }
    try:
        await asyncio.gather(*(asyncio.to_thread(w.start) for w in workers.values()))
        with served.client() as c:
            job = c.submit(
                command_spec([PY, str(scripts / "sleepy.py")], gpus=1, nodes=2, retries=3)
            )

            def both_running() -> bool:
                return set(rank_pids(_records(c, job.id))) == {0, 1}

            await asyncio.to_thread(wait_until, both_running, 60.0, what="both ranks running")
            pids = rank_pids(_records(c, job.id))
            placed = c.get(job.id).placement
            assert placed is not None
            # Kill the worker of node 0: the one whose torchrun hosts the rendezvous store.
            victim = next(n.worker_name for n in placed.nodes if n.node_rank == 0)
            workers[victim].kill()
            done = await asyncio.to_thread(c.wait, job.id, 30.0)
        assert done.state == JobState.LOST and done.attempts == 0, done
        assert done.reason is not None and done.reason.startswith(f"worker {victim} was lost")
        # Its own rank died with it (pdeathsig) and the survivor's was stopped by its worker.
        await until(lambda: not any(pid_alive(p) for p in pids.values()), 10.0, what=f"{pids} gone")
    finally:
        for w in workers.values():
            await asyncio.to_thread(w.stop)


def _records(c: Any, job_id: str) -> list[tuple[str, int | None, str]]:
    page = c.logs(job_id, limit=5000)
    return [(r.stream, r.rank, r.text) for r in page.records]
