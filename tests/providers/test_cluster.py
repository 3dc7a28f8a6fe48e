"""The cluster id (store migration 7): made once, the owner tag of every machine, so a second
control plane on the same store (a standby taking over) finds the first one's machines running
on real Slurm; and two servers given different providers.toml are told what differs."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import pytest

from gpulayer_kernel.autoscale import reconcile
from gpulayer_kernel.contracts import Instance, InstanceState
from gpulayer_kernel.providers import (
    LaunchSpec,
    build,
    cluster_id,
    compare_providers,
    legacy_tag,
    parse_config,
)
from gpulayer_kernel.store import SqliteStore, open_store
from gpulayer_kernel.testing.postgres import PostgresServer
from gpulayer_kernel.testing.slurm import SlurmCluster

S = InstanceState


async def test_the_cluster_id_is_made_once_and_every_server_reads_the_same(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    try:
        first = await cluster_id(store, tmp_path / "a")
        again = await cluster_id(store, tmp_path / "b")  # another server, another home
        assert first == again and len(first) == 12 and first != legacy_tag(tmp_path / "a")
    finally:
        await store.close()
    reopened = SqliteStore(tmp_path / "cp.db")
    await reopened.open()
    try:
        assert await cluster_id(reopened, tmp_path / "c") == first
    finally:
        await reopened.close()


async def test_an_active_and_a_standby_on_postgresql_claim_one_cluster_id_at_once(
    tmp_path: Path, gl_postgres: PostgresServer
) -> None:
    url = gl_postgres.create_database()
    a, b = open_store(url), open_store(url)
    await a.open()
    await b.open()
    try:
        ids = await asyncio.gather(cluster_id(a, tmp_path / "a"), cluster_id(b, tmp_path / "b"))
        assert ids[0] == ids[1] and len(ids[0]) == 12  # the claim that lost changed nothing
    finally:
        await a.close()
        await b.close()


async def test_an_upgraded_store_keeps_its_server_s_tag_so_its_machines_stay_found(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    try:
        # One machine launched before the cluster id existed.
        await store.save_instances([_instance("111111111111", "4", S.JOINED)])
        assert await cluster_id(store, tmp_path / "a") == legacy_tag(tmp_path / "a")
    finally:
        await store.close()


@pytest.mark.slow
async def test_a_second_control_plane_adopts_the_first_s_slurm_machine_and_fails_nothing(
    tmp_path: Path, gl_slurm: SlurmCluster
) -> None:
    config = parse_config(
        {
            "providers": {
                "slurm": {
                    "kind": "slurm",
                    "slurm_conf": str(gl_slurm.conf),
                    "gpulayer": [sys.executable, "-m", "gpulayer_kernel.cli"],
                    "time_limit": "5",
                    "partitions": {
                        gl_slurm.partition: {"price_per_gpu_hour": 2.1, "simulate": True}
                    },
                }
            }
        }
    )
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    first = build(config, home=home_a, owner=await cluster_id(store, home_a))["slurm"]
    second = build(config, home=home_b, owner=await cluster_id(store, home_b))["slurm"]
    before = build(config, home=home_b)["slurm"]  # the tag of host and home, as before
    [offer, _] = await first.offers()
    how = LaunchSpec("0123456789ab", "slurm-adopt", "http://127.0.0.1:9")  # it waits to join
    job_id = await first.launch(offer, "glt_i_000000000000_unused", how)
    try:
        inst = _instance("0123456789ab", job_id, S.BOOTING, offer=offer)
        await store.save_instances([inst])
        known = {i.id: i for i in await store.load_instances()}  # what the new leader loads
        census = await second.instances()
        [mine] = [r for r in census.reported if r.external_id == job_id]
        assert mine.instance_id == inst.id and mine.state in ("booting", "running")
        r = reconcile(known, {"slurm": census}, now=inst.requested_at + 1)
        assert not [c for c in r.changes if c.state == S.FAILED], r.changes
        assert not r.strays and not r.terminate
        # The bug this fixes: tagged by host and home, the new leader does not see the machine
        # and calls it gone ("slurm no longer reports its machine"), leaving it running.
        old = reconcile(known, {"slurm": await before.instances()}, now=inst.requested_at + 1)
        assert [c.state for c in old.changes] == [S.FAILED]
    finally:
        await second.terminate(inst.id, job_id)  # the new leader ends it: its own
        gone = next(r for r in (await first.instances()).reported if r.external_id == job_id)
        assert gone.state == "ended"
        await store.close()


async def test_two_servers_given_different_providers_toml_are_told_what_differs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = {"kind": "fake", "offers": [{"name": "a", "gpus": 1, "price_per_hour": 1.0}]}
    leader = parse_config({"providers": {"fake": fake}})
    other = parse_config(
        {"autoscale": {"idle_timeout": 60}, "providers": {"fake": {**fake, "max_instances": 9}}}
    )
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    try:
        assert await compare_providers(store, leader, record=True) == []  # first: nothing to say
        caplog.set_level(logging.WARNING, "gpulayer.providers")
        assert await compare_providers(store, leader, record=True) == []
        assert not caplog.records
        diff = await compare_providers(store, other, record=False)  # a standby, say
        assert diff == [
            "autoscale.idle_timeout: 60.0 here, 300.0 on the leader",
            "providers.fake.max_instances: 9 here, 4 on the leader",
        ]
        assert "providers.fake.max_instances: 9 here, 4 on the leader" in caplog.text
        missing = await compare_providers(store, None, record=False)  # no providers.toml
        assert missing == [
            "autoscale: absent here, set on the leader",
            "costs: absent here, set on the leader",
            "providers: absent here, set on the leader",
        ]
        await compare_providers(store, other, record=True)  # it leads now: its config stands
        stored = await store.get_cluster_value("providers_config")
        assert stored is not None and json.loads(stored)["autoscale"]["idle_timeout"] == 60
    finally:
        await store.close()


def _instance(iid: str, external: str, state: InstanceState, offer: object = None) -> Instance:
    from gpulayer_kernel.contracts import Offer

    o = (
        offer
        if isinstance(offer, Offer)
        else Offer(provider="slurm", name="gpu-1gpu", gpus=1, price_per_hour=2.1)
    )
    return Instance(
        id=iid,
        provider="slurm",
        offer=o,
        worker_name=f"slurm-{iid[:8]}",
        state=state,
        external_id=external,
        requested_at=1000.0,
        boot_deadline=1600.0,
    )
