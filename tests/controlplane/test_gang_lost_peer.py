"""A multi-node gang whose worker died ends ``lost``, as docs/distributed.md says, also when a
surviving node reports first that its ranks failed for want of the dead peer (issue 36)."""

from __future__ import annotations

from pathlib import Path

from gpulayer_kernel.contracts import FinishReport, JobState, WorkerRegistration
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import sim_caps
from ..distributed.conftest import command_spec


async def _gang(
    tmp_path: Path,
) -> tuple[ControlPlane, SqliteStore, str, dict[str, str], dict[str, int]]:
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    cp = ControlPlane(
        store, LocalArtifactStore(tmp_path / "blobs"), clock=FakeClock(), heartbeat_timeout=60.0
    )
    await cp.start()
    ids = {
        n: (await cp.register(WorkerRegistration(name=n, capabilities=sim_caps(1)))).id
        for n in ("wa", "wb")
    }
    job = await cp.submit(command_spec(["python", "train.py"], gpus=1, nodes=2, retries=3))

    async def placed() -> bool:
        return (await cp.get(job.id)).state == JobState.PLACED

    await until(placed, what="the gang's placement")
    for wid in ids.values():
        await cp.next_work(wid)
        await cp.report_started(wid, job.id, attempt=0)
    placement = (await cp.get(job.id)).placement
    assert placement is not None
    nodes = {n.worker_name: n.node_rank for n in placement.nodes}
    return cp, store, job.id, ids, nodes


async def test_a_survivor_failing_after_its_peer_died_ends_the_gang_lost(tmp_path: Path) -> None:
    cp, store, job_id, ids, nodes = await _gang(tmp_path)
    try:
        cp.worker_disconnected(ids["wb"])  # killed: its long-poll connection closed
        survivor = FinishReport(
            state="failed",
            exit_code=1,
            attempt=0,
            reason="rank 0 exited with code 1 after losing a peer (look at the other nodes)",
        )
        done = await cp.report_finished(ids["wa"], job_id, survivor)
        assert done.state == JobState.LOST, done.reason
        assert done.reason is not None and done.reason.startswith("worker wb was lost")
        assert f"node {nodes['wa']} (wa): rank 0 exited with code 1" in done.reason
        assert done.attempts == 0, "a gang is never retried"
        assert job_id in (await cp.next_work(ids["wb"])).cancel  # the rest is told to stop
    finally:
        await cp.close()
        await store.close()


async def test_a_gang_whose_peers_are_all_alive_still_fails(tmp_path: Path) -> None:
    cp, store, job_id, ids, nodes = await _gang(tmp_path)
    try:
        report = FinishReport(state="failed", exit_code=1, attempt=0, reason="rank 1: boom")
        done = await cp.report_finished(ids["wb"], job_id, report)
        assert done.state == JobState.FAILED
        assert done.reason == f"node {nodes['wb']} (wb): rank 1: boom"
    finally:
        await cp.close()
        await store.close()
