"""The control plane's decision (pure), and its store of workspace files: a digest alone never
gives one user another's content; a pack whose bytes do not match their digest is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    Job,
    Resources,
    SessionHolder,
    SessionSpec,
    WorkerRegistration,
)
from gpulayer_kernel.contracts.workspace import (
    PathMap,
    WorkerShares,
    WorkspaceAnswer,
    WorkspaceCall,
    WorkspaceSource,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import BundleError, Forbidden, InvalidInput, Unavailable
from gpulayer_kernel.pytest_plugin import sim_caps
from gpulayer_kernel.security.roles import Identity, Role
from gpulayer_kernel.testing import until
from gpulayer_kernel.workspace import pack as packs
from gpulayer_kernel.workspace import service
from gpulayer_kernel.workspace.plan import decide, parse_share

SRC = WorkspaceSource(folder="/home/alice/proj", host="laptop")


def test_in_place_through_the_longest_share_with_its_mapping() -> None:
    shares = WorkerShares(
        host="box",
        shared=[PathMap(here="/home", there="/mnt/home"), PathMap(here="/home/alice", there="/a")],
    )
    plan = decide(SRC, shares, worker="box")
    assert (plan.mode, plan.path) == ("in_place", "/a/proj")
    assert "shares /home/alice/proj" in plan.reason


def test_the_same_host_is_in_place_another_is_synced_an_old_worker_none() -> None:
    assert decide(SRC, WorkerShares(host="laptop"), worker="w").mode == "in_place"
    assert decide(SRC, None, worker="w", in_process=True).path == "/home/alice/proj"
    synced = decide(SRC, WorkerShares(host="far"), worker="w")
    assert synced.mode == "synced" and "does not see /home/alice/proj" in synced.reason
    old = decide(SRC, None, worker="w")
    assert old.mode == "none" and "from before workspaces" in old.reason
    no_sync = decide(SRC, WorkerShares(host="far", synced=False), worker="w")
    assert no_sync.mode == "none" and "takes no synced workspaces" in no_sync.reason
    # a share that only starts like the folder is not it
    near = WorkerShares(host="far", shared=[PathMap(here="/home/al", there="/x")])
    assert decide(SRC, near, worker="w").mode == "synced"


def test_a_shared_path_flag_names_what_is_wrong() -> None:
    assert parse_share("/data") == PathMap(here="/data", there="/data")
    assert parse_share("/home=/mnt/home") == PathMap(here="/home", there="/mnt/home")
    with pytest.raises(InvalidInput) as err:
        parse_share("home=/mnt/home")
    assert err.value.code == "bad_shared_path" and "--shared-path" in err.value.message


async def test_a_digest_alone_never_gives_another_users_file(gl_cp: ControlPlane) -> None:
    for name in ("alice", "bob"):
        await gl_cp.users.add(name, Role.USER)
    alice, bob = Identity("alice", Role.USER), Identity("bob", Role.USER)
    plane = gl_cp.workspace
    secret = b"alice's private notes"
    digest = hashlib.sha256(secret).hexdigest()
    assert await plane.missing([digest], alice) == [digest]
    await plane.put_pack(packs.pack([(digest, secret)]), "alice")
    assert await plane.missing([digest], alice) == []
    # bob learned the digest: it is still missing for him, and reading it gives him nothing
    assert await plane.missing([digest], bob) == [digest]
    assert list(packs.unpack(await plane.read_pack([digest], "bob"))) == []
    assert list(packs.unpack(await plane.read_pack([digest], "alice"))) == [(digest, secret)]
    # with the bytes in hand, bob may claim it for himself (proof of possession)
    await plane.put_pack(packs.pack([(digest, secret)]), "bob")
    assert await plane.missing([digest], bob) == []


async def test_a_pack_whose_bytes_do_not_match_is_refused_and_stores_nothing(
    gl_cp: ControlPlane, tmp_path: Path
) -> None:
    plane = gl_cp.workspace
    forged = "0" * 64
    with pytest.raises(BundleError) as err:
        await plane.put_pack(packs.pack([(forged, b"not that")]), "admin")
    assert "refused" in err.value.message
    assert not gl_cp.artifacts.has(forged)
    with pytest.raises(BundleError):
        await plane.put_pack(b"not zstd at all", "admin")


async def test_a_multi_node_session_is_synced_on_its_first_node_only(gl_cp: ControlPlane) -> None:
    """Each node asks for its own plan: the first holds the synced copy (its worker answers
    the host's calls); another node runs in place where it sees the folder, else in scratch,
    saying why, and never takes the host's calls."""
    far = WorkerShares(host="far")
    sees = WorkerShares(host="near", shared=[PathMap(here="/home", there="/mnt/home")])
    ids = {}
    for name, shares in (("a1", far), ("a2", far), ("a3", sees)):
        reg = WorkerRegistration(name=name, capabilities=sim_caps(1), shares=shares)
        ids[name] = (await gl_cp.register(reg)).id
    await gl_cp.start_session(
        SessionSpec(
            name="two",
            holder=SessionHolder(client="kernel-a", notebook="train.ipynb"),
            resources=Resources(gpus=1, nodes=3),
            workspace=SRC,
        )
    )

    async def placed() -> bool:
        return (await gl_cp.get_session("two")).job.placement is not None

    await until(placed, what="the session to be placed")
    job = (await gl_cp.get_session("two")).job
    assert job.placement is not None
    first, *others = [n.worker_name for n in job.placement.nodes]
    plane = gl_cp.workspace
    plans = {n: await plane.plan(job, ids[n]) for n in ids}
    on_first = plans[first]
    assert on_first is not None and on_first.mode == ("synced" if first != "a3" else "in_place")
    assert await plane.plan(job) == on_first  # what the session shows: its first node's
    for name in others:
        plan = plans[name]
        assert plan is not None
        if name == "a3":
            assert (plan.mode, plan.path) == ("in_place", "/mnt/home/alice/proj")
        else:
            assert plan.mode == "none", plan
            assert f"first node ({first})" in plan.reason and "scratch" in plan.reason
    # only the first node's worker may take and answer the host's calls
    assert (await plane.next_calls(job.id, ids[first], 0)).calls == []
    answer = WorkspaceAnswer(id="c1", ok=True)
    for name in others:
        for attempt in (
            plane.next_calls(job.id, ids[name], 0),
            plane.answer(job.id, ids[name], answer),
        ):
            with pytest.raises(Forbidden) as err:
                await attempt
            assert err.value.code == "workspace_not_this_node"
            assert f"first node ({first})" in err.value.message


async def synced_session(cp: ControlPlane) -> tuple[Job, str]:
    """A running session with a synced workspace (its worker is on another host); its job and
    its worker's id."""
    reg = WorkerRegistration(name="far", capabilities=sim_caps(1), shares=WorkerShares(host="x"))
    wid = (await cp.register(reg)).id
    holder = SessionHolder(client="kernel-a", notebook="t.ipynb")
    spec = SessionSpec(name="s", holder=holder, resources=Resources(gpus=1), workspace=SRC)
    await cp.start_session(spec)

    async def placed() -> bool:
        return (await cp.get_session("s")).job.placement is not None

    await until(placed, what="the session to be placed")
    return (await cp.get_session("s")).job, wid


async def test_an_ended_session_leaves_no_lane_or_plan_behind(gl_cp: ControlPlane) -> None:
    """The lane and the plan are in memory per session: its end drops them, so a server that
    runs sessions for months does not grow by one of each per session."""
    job, wid = await synced_session(gl_cp)
    plane = gl_cp.workspace
    assert (await plane.plan(job, wid)) is not None
    await plane.answer(job.id, wid, WorkspaceAnswer(id="c1", ok=True))
    assert job.id in plane._lanes and job.id in plane._plans
    await gl_cp.stop_session("s")

    async def gone() -> bool:
        return job.id not in plane._lanes and job.id not in plane._plans

    await until(gone, what="the ended session's lane and plan to be dropped")


async def test_a_session_moved_before_it_started_gets_its_new_workers_plan(
    gl_cp: ControlPlane,
) -> None:
    """Placed on a worker on another host (synced), that worker lost before the session
    started: back in the queue, then placed on a worker that sees the folder (in place). The
    plan is its new worker's, not the one decided for the first."""
    job, wid = await synced_session(gl_cp)
    plane = gl_cp.workspace
    first = await plane.plan(job, wid)
    assert first is not None and first.mode == "synced"
    sees = WorkerShares(host="near", shared=[PathMap(here="/home", there="/mnt/home")])
    reg = WorkerRegistration(name="near", capabilities=sim_caps(1), shares=sees)
    near = (await gl_cp.register(reg)).id
    await gl_cp.remove_worker(wid, force=True)  # placed, not started: back to the queue

    async def moved() -> bool:
        placement = (await gl_cp.get_session("s")).job.placement
        return placement is not None and placement.nodes[0].worker_id == near

    await until(moved, what="the session to be placed on the worker that sees the folder")
    job = (await gl_cp.get_session("s")).job
    plan = await plane.plan(job, near)
    assert plan is not None and (plan.mode, plan.path) == ("in_place", "/mnt/home/alice/proj")
    assert await plane.plan(job) == plan
    with pytest.raises(Forbidden):  # the worker of the earlier placement takes no calls
        await plane.next_calls(job.id, wid, 0)


async def test_a_lane_whose_worker_takes_nothing_holds_at_most_kept_calls(
    gl_cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "KEPT", 3)
    job, wid = await synced_session(gl_cp)
    plane = gl_cp.workspace
    for i in range(8):
        with pytest.raises(Unavailable) as err:
            await plane.call("s", WorkspaceCall(id=f"c{i}", op="collect"), 0, None)
        assert err.value.code == "workspace_timeout"
    calls = (await plane.next_calls(job.id, wid, 0)).calls
    assert [c.id for c in calls] == ["c5", "c6", "c7"]  # the newest; the others are sent again


async def test_the_cache_of_a_users_files_stays_bounded_and_answers_the_same(
    gl_cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "OWNED_KEPT", 3)
    plane = gl_cp.workspace
    files = [f"file {i}".encode() for i in range(10)]
    digests = [hashlib.sha256(b).hexdigest() for b in files]
    for digest, data in zip(digests, files, strict=True):
        await plane.put_pack(packs.pack([(digest, data)]), "admin")
        assert len(plane._owned["admin"]) <= 4
    assert await plane.missing(digests, None) == []  # the store answers what the cache forgot
    assert len(plane._owned["admin"]) <= 4
