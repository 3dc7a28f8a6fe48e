"""Whose machines a restored database may touch (issue 32, item 3; ``store/backup_cluster.py``),
and a refused restore leaves nothing behind (item 7).

- a restore into another place is a copy: a new cluster id (the original's kept as
  ``restored_from``), its live instances marked as the original's, left running;
- into the place the backup was taken, or ``--as-original``, the id is kept; ``--as-original``
  is refused while the original still leads (its home's lock; PostgreSQL: the leadership lock),
  and then restores nothing;
- a restore over a PostgreSQL database a control plane leads is refused;
- a refused ``gpulayer db restore`` leaves no home folder, lock file or database file it made.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import Instance, InstanceState, Offer
from gpulayer_kernel.errors import Conflict
from gpulayer_kernel.ha.leadership import Leadership
from gpulayer_kernel.home import Layout, StateLock
from gpulayer_kernel.store import open_store
from gpulayer_kernel.store.backup import restore_backup, take_backup
from gpulayer_kernel.testing.postgres import PostgresServer
from gpulayer_kernel.testing.processes import GL

OFFER = Offer(provider="slurm", name="gpu-1gpu", gpus=1, gpu_kind="a100", price_per_hour=2.1)


def machine(iid: str, state: InstanceState) -> Instance:
    return Instance(
        id=iid * 12,
        provider="slurm",
        offer=OFFER,
        state=state,
        worker_name=f"slurm-{iid}",
        requested_at=1.0,
        boot_deadline=100.0,
        external_id="4242",
    )


async def _cluster(url: str, *, instances: list[Instance], cluster: str | None) -> None:
    store = open_store(url)
    await store.open()
    try:
        await store.save_instances(instances)
        if cluster is not None:
            await store.claim_cluster_value("cluster_id", cluster)
    finally:
        await store.close()


async def _read(url: str) -> tuple[str | None, str | None, dict[str, Instance]]:
    store = open_store(url)
    await store.open()
    try:
        found = {i.id: i for i in await store.load_instances(ended=True)}
        return (
            await store.get_cluster_value("cluster_id"),
            await store.get_cluster_value("restored_from"),
            found,
        )
    finally:
        await store.close()


async def test_a_restore_elsewhere_is_a_copy_with_a_cluster_of_its_own(tmp_path: Path) -> None:
    home = tmp_path / "orig"
    home.mkdir()
    url = f"sqlite://{Layout(home).db}"
    live, gone = machine("a", InstanceState.JOINED), machine("b", InstanceState.TERMINATED)
    await _cluster(url, instances=[live, gone], cluster="c0ffee000001")
    report = await take_backup(url, None, tmp_path / "bk", home=home)
    assert report.cluster is None

    copy = f"sqlite://{tmp_path}/copy.db"
    restored = await restore_backup(tmp_path / "bk", copy, None)
    c = restored.cluster
    assert c is not None and c.copy and c.original == "c0ffee000001"
    assert c.cluster_id and c.cluster_id != "c0ffee000001" and c.left_running == 1
    cluster, restored_from, found = await _read(copy)
    assert (cluster, restored_from) == (c.cluster_id, "c0ffee000001")
    left = found[live.id]
    assert left.state == InstanceState.TERMINATED and "left running" in (left.reason or "")
    assert "c0ffee000001" in (left.reason or "") and left.ended_at is not None
    assert found[gone.id] == gone  # an ended one is as it was

    # Into the place it was taken (the original, put back): the id is kept.
    back = await restore_backup(tmp_path / "bk", url, None, force=True)
    assert back.cluster is not None and not back.cluster.copy
    assert (await _read(url))[0] == "c0ffee000001"


async def test_as_original_is_refused_while_the_original_runs(tmp_path: Path) -> None:
    home = tmp_path / "orig"
    home.mkdir()
    url = f"sqlite://{Layout(home).db}"
    await _cluster(url, instances=[machine("a", InstanceState.JOINED)], cluster="c0ffee000002")
    await take_backup(url, None, tmp_path / "bk", home=home)
    lock = StateLock(Layout(home))
    lock.acquire()  # the original's control plane runs
    target = tmp_path / "new" / "gpulayer.db"
    try:
        with pytest.raises(Conflict) as info:
            await restore_backup(tmp_path / "bk", f"sqlite://{target}", None, as_original=True)
    finally:
        lock.release()
    err = info.value
    assert err.code == "original_still_leads" and str(home.resolve()) in err.message
    assert "stop the original's servers first" in err.hint
    assert not target.exists() and not target.parent.exists()  # nothing was restored
    kept = await restore_backup(tmp_path / "bk", f"sqlite://{target}", None, as_original=True)
    assert kept.cluster is not None and not kept.cluster.copy
    cluster, _, found = await _read(f"sqlite://{target}")
    assert cluster == "c0ffee000002"
    assert found["a" * 12].state == InstanceState.JOINED  # its machines are its own


def test_a_refused_restore_leaves_no_folder_lock_or_file(tmp_path: Path) -> None:
    (tmp_path / "not-a-backup").mkdir()
    home = tmp_path / "fresh-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    r = subprocess.run(
        [*GL, "db", "restore", str(tmp_path / "not-a-backup"), "--home", str(home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "not a GPUlayer backup" in r.stderr, r.stderr
    assert not home.exists()  # it used to keep the folder and controlplane.lock


@pytest.mark.slow
async def test_postgres_as_original_and_a_led_target_are_refused(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    src = gl_postgres.create_database()
    await _cluster(src, instances=[machine("a", InstanceState.JOINED)], cluster="c0ffee000003")
    await take_backup(src, None, tmp_path / "bk")
    leader = Leadership(src, "http://127.0.0.1:1")
    await leader.acquire()  # the original's leader holds the lock
    try:
        third = gl_postgres.create_database()
        with pytest.raises(Conflict) as info:
            await restore_backup(tmp_path / "bk", third, None, as_original=True)
        assert info.value.code == "original_still_leads"
        # A restore over the led database itself is refused too (even forced).
        with pytest.raises(Conflict) as led:
            await restore_backup(tmp_path / "bk", src, None, force=True)
        assert led.value.code == "restore_while_led"
    finally:
        await leader.release()
    copy = gl_postgres.create_database()
    made = await restore_backup(tmp_path / "bk", copy, None)
    assert made.cluster is not None and made.cluster.copy and made.cluster.left_running == 1
    cluster, restored_from, found = await _read(copy)
    assert cluster != "c0ffee000003" and restored_from == "c0ffee000003"
    assert found["a" * 12].state == InstanceState.TERMINATED
    kept = await restore_backup(tmp_path / "bk", third, None, as_original=True)
    assert kept.cluster is not None and not kept.cluster.copy
    assert (await _read(third))[0] == "c0ffee000003"
