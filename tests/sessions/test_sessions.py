"""Sessions on the control plane with a real in-process worker: state, cells recorded, holders,
names, interrupts, restarts, broken ranks, lost workers, stop while a cell runs."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gpulayer_kernel.contracts import (
    CellRequest,
    CellState,
    JobState,
    SessionHolder,
    SessionStatus,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.controlplane.sessions import cells as session_cells
from gpulayer_kernel.errors import Conflict, Forbidden, NotFound
from gpulayer_kernel.testing import until

from ..conftest import WorkerFactory
from .conftest import HOLDER, run, spec, up

pytestmark = pytest.mark.slow


async def test_a_session_keeps_state_and_records_every_cell(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    info = await gl_cp.start_session(spec())
    assert info.status == SessionStatus.WAITING and info.job.spec.is_session
    await up(gl_cp, "s1")
    first = await run(gl_cp, "s1", "y = 5\nprint('set y')\ny")
    assert first.cell.state == CellState.OK and first.cell.value is not None
    assert first.cell.value["data"]["text/plain"] == "5"
    assert [(r.stream, r.text, r.cell) for r in first.records] == [("stdout", "set y", 1)]
    second = await run(gl_cp, "s1", "y * 2")
    assert second.cell.number == 2 and second.cell.value["data"]["text/plain"] == "10"  # type: ignore[index]
    cells = await gl_cp.session_cells("s1")
    assert [c.number for c in cells] == [2, 1]
    assert cells[1].code == "y = 5\nprint('set y')\ny" and cells[1].duration is not None
    assert cells[1].summary == "5"
    # The cells' output is the session job's log: `gpulayer logs` shows its history.
    logs = await gl_cp.logs(info.id)
    assert any(r.text == "set y" and r.cell == 1 for r in logs.records)
    assert (await gl_cp.get_session("s1")).cells == 2


async def test_an_error_is_the_cells_and_the_session_survives(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    await run(gl_cp, "s1", "x = 1")
    failed = await run(gl_cp, "s1", "1 / 0")
    assert failed.cell.state == CellState.ERROR
    assert failed.cell.error is not None and failed.cell.error.ename == "ZeroDivisionError"
    assert failed.cell.summary.startswith("ZeroDivisionError")
    assert (await run(gl_cp, "s1", "x")).cell.value["data"]["text/plain"] == "1"  # type: ignore[index]


async def test_names_are_unique_among_live_sessions(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec("train"))
    other = SessionHolder(client="kernel-b", notebook="eval.ipynb")
    with pytest.raises(Conflict) as err:
        await gl_cp.start_session(spec("train").model_copy(update={"holder": other}))
    assert err.value.code == "session_name_taken"
    assert "`train.ipynb`" in err.value.message and "attach" in err.value.hint
    await gl_cp.stop_session("train")
    await until(lambda: _ended(gl_cp, "train"), what="the first train to end")
    again = await gl_cp.start_session(spec("train"))  # free again once the first one ended
    assert again.status == SessionStatus.WAITING


async def _ended(cp: ControlPlane, name: str) -> bool:
    return (await cp.get_session(name)).status == SessionStatus.ENDED


async def test_only_the_holder_runs_cells_until_another_attaches(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    await run(gl_cp, "s1", "secret_state = 42")
    with pytest.raises(Forbidden) as err:
        await gl_cp.run_cell("s1", CellRequest(code="secret_state", client="kernel-b"), wait=5)
    assert err.value.code == "session_held" and "attach" in err.value.hint
    assert (await gl_cp.get_session("s1")).cells == 1  # the refused cell was never numbered
    await gl_cp.attach_session("s1", SessionHolder(client="kernel-b", notebook="train.ipynb"))
    page = await run(gl_cp, "s1", "secret_state", client="kernel-b")
    assert page.cell.value["data"]["text/plain"] == "42"  # type: ignore[index]
    with pytest.raises(Forbidden):
        await gl_cp.run_cell("s1", CellRequest(code="1", client=HOLDER.client), wait=5)


async def test_a_cell_in_a_session_that_does_not_exist_says_which_exist(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec("alpha"))
    with pytest.raises(NotFound) as err:
        await gl_cp.run_cell("beta", CellRequest(code="1"), wait=1)
    assert err.value.code == "session_not_found" and "alpha" in err.value.message


async def test_an_interrupt_stops_the_cell_and_keeps_the_state(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    await run(gl_cp, "s1", "kept = 'yes'")
    page = await gl_cp.run_cell(
        "s1",
        CellRequest(code="import time\nprint('go', flush=True)\ntime.sleep(60)", client="kernel-a"),
        wait=10,
    )
    assert page.cell.state == CellState.RUNNING and page.records[0].text == "go"
    assert (await gl_cp.get_session("s1")).status == SessionStatus.BUSY
    await gl_cp.interrupt_session("s1")
    page = await gl_cp.follow_cell("s1", page.cell.number, page.next_since, wait=30)
    assert page.cell.state == CellState.ERROR and page.cell.error.ename == "KeyboardInterrupt"  # type: ignore[union-attr]
    assert (await run(gl_cp, "s1", "kept")).cell.value["data"]["text/plain"] == "'yes'"  # type: ignore[index]


async def test_cells_queue_behind_each_other_in_order(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    await run(gl_cp, "s1", "seen = []")
    pages = await asyncio.gather(
        *(
            run(gl_cp, "s1", f"import time; time.sleep(0.05); seen.append({i}); len(seen)")
            for i in range(4)
        )
    )
    assert sorted(p.cell.number for p in pages) == [2, 3, 4, 5]
    final = await run(gl_cp, "s1", "seen")
    assert final.cell.value["data"]["text/plain"] == "[0, 1, 2, 3]"  # type: ignore[index]


async def test_a_dead_rank_breaks_the_session_until_a_restart(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    pid = int((await run(gl_cp, "s1", "import os; os.getpid()")).cell.value["data"]["text/plain"])  # type: ignore[index]
    os.kill(pid, signal.SIGKILL)

    async def broken() -> bool:
        return (await gl_cp.get_session("s1")).status == SessionStatus.BROKEN

    await until(broken, 30, what="the session to be broken")
    info = await gl_cp.get_session("s1")
    assert "rank 0" in (info.reason or "") and "SIGKILL" in (info.reason or "")
    with pytest.raises(Conflict) as err:
        await gl_cp.run_cell("s1", CellRequest(code="1", client="kernel-a"), wait=5)
    assert err.value.code == "session_broken" and "restart" in err.value.hint
    await gl_cp.restart_session("s1")
    await up(gl_cp, "s1")
    page = await run(gl_cp, "s1", "'fresh' if 'os' not in dir() else 'stale'")
    assert page.cell.value["data"]["text/plain"] == "'fresh'"  # type: ignore[index]


async def test_a_cell_that_kills_its_rank_reports_it_and_breaks_the_session(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    page = await run(gl_cp, "s1", "import os; os._exit(3)")
    assert page.cell.state == CellState.ABORTED and "exited with code 3" in (page.cell.reason or "")
    assert (await gl_cp.get_session("s1")).status == SessionStatus.BROKEN


async def test_stopping_a_session_while_a_cell_runs_aborts_the_cell_and_frees_it(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    info = await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    page = await gl_cp.run_cell(
        "s1", CellRequest(code="import time; time.sleep(60)", client="kernel-a"), wait=0.5
    )
    await gl_cp.stop_session("s1")
    page = await gl_cp.follow_cell("s1", page.cell.number, 0, wait=30)
    assert page.cell.state == CellState.ABORTED and "stopped by the user" in (
        page.cell.reason or ""
    )
    job = await gl_cp.wait(info.id, timeout=30)
    assert job.state == JobState.CANCELLED
    with pytest.raises(Conflict) as err:
        await gl_cp.run_cell("s1", CellRequest(code="1", client="kernel-a"), wait=1)
    assert err.value.code == "session_ended" and "stopped by the user" in err.value.message


async def test_a_lost_worker_ends_the_session_with_the_reason_in_the_next_cell(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    w = await gl_worker(name="w1")
    await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    assert w.info is not None
    await gl_cp.remove_worker("w1", force=True)
    with pytest.raises(Conflict) as err:
        await gl_cp.run_cell("s1", CellRequest(code="1", client="kernel-a"), wait=1)
    assert err.value.code == "session_ended"
    assert "lost" in err.value.message and "removed by an admin" in err.value.message


async def test_secrets_are_masked_in_session_output(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_cp.set_secret("API_KEY", "CANARY-SECRET-VALUE-123")
    await gl_worker()
    await gl_cp.start_session(spec().model_copy(update={"secrets": ["API_KEY"]}))
    await up(gl_cp, "s1")
    page = await run(
        gl_cp,
        "s1",
        "import os\nk = os.environ['API_KEY']\nprint(k)\nfrom IPython.display import HTML\n"
        "display(HTML('<b>' + k + '</b>'))\nk",
    )
    text = page.model_dump_json()
    assert "CANARY-SECRET-VALUE-123" not in text and "***" in text
    stored = (await gl_cp.session_cells("s1"))[0].model_dump_json()
    assert "CANARY-SECRET-VALUE-123" not in stored


async def test_a_job_waiting_for_gpus_a_session_holds_is_told_so(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    from gpulayer_kernel.contracts import CommandWorkload, JobSpec, Resources

    await gl_worker(name="box", gpus=2)
    await gl_cp.start_session(spec(gpus=2))
    await up(gl_cp, "s1")
    job = await gl_cp.submit(
        JobSpec(workload=CommandWorkload(argv=["true"]), resources=Resources(gpus=2))
    )

    async def waiting() -> bool:
        return (await gl_cp.get(job.id)).pending is not None

    await until(waiting, what="the job's first pending report")
    pending = (await gl_cp.get(job.id)).pending
    assert pending is not None and [h.name for h in pending.sessions] == ["s1"]
    sentence = await gl_cp.explain(job.id)
    assert "2 GPUs held by the idle session of `train.ipynb` on box for" in sentence
    assert "waiting helps" in sentence
    await gl_cp.stop_session("s1")  # freeing them places the job
    placed = await gl_cp.wait(job.id, timeout=60)
    assert placed.state == JobState.SUCCEEDED


async def test_a_users_session_is_theirs_alone(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    from gpulayer_kernel.security.roles import Identity, Role

    alice, bob = Identity("alice", Role.USER), Identity("bob", Role.USER)
    viewer, admin = Identity("vera", Role.VIEWER), Identity("admin", Role.ADMIN)
    await gl_worker()
    info = await gl_cp.start_session(spec(), who=alice)
    assert info.job.owner == "alice"
    await up(gl_cp, "s1")
    await gl_cp.run_cell("s1", CellRequest(code="x = 1", client=HOLDER.client), wait=10, who=alice)
    for call in (
        gl_cp.get_session("s1", who=bob),
        gl_cp.run_cell("s1", CellRequest(code="x", client=HOLDER.client), wait=1, who=bob),
        gl_cp.session_cells("s1", who=bob),
        gl_cp.interrupt_session("s1", who=bob),
        gl_cp.stop_session("s1", who=bob),
        gl_cp.attach_session("s1", SessionHolder(client="bob-kernel"), who=bob),
    ):
        with pytest.raises(Forbidden) as err:
            await call
        assert err.value.code == "not_yours"
    assert await gl_cp.list_sessions(who=bob) == []
    # A viewer reads every session, and changes none.
    assert [s.name for s in await gl_cp.list_sessions(who=viewer)] == ["s1"]
    with pytest.raises(Forbidden) as err:
        await gl_cp.run_cell("s1", CellRequest(code="x", client=HOLDER.client), wait=1, who=viewer)
    assert err.value.code == "role_forbidden"
    assert (await gl_cp.get_session("s1")).cells == 1  # nothing ran for them
    # An admin acts on it (here: takes it over, as "and an admin" may).
    await gl_cp.attach_session("s1", SessionHolder(client="admin-kernel"), who=admin)
    page = await run(gl_cp, "s1", "x", client="admin-kernel")
    assert page.cell.value["data"]["text/plain"] == "1"  # type: ignore[index]


async def test_a_cells_end_rides_with_the_next_cells_start(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One commit a cell, not two: an end is answered from memory, listed as it ended, and
    stored with the next cell's start (or on its own, ``END_WITHIN`` later)."""
    monkeypatch.setattr(session_cells, "END_WITHIN", 600.0)  # only the next write stores it
    await gl_worker()
    info = await gl_cp.start_session(spec())
    await up(gl_cp, "s1")
    first = await run(gl_cp, "s1", "y = 5\ny")
    assert first.cell.state == CellState.OK
    stored = await gl_cp.store.get_cell(info.id, 1)
    assert stored is not None and stored.state == CellState.QUEUED  # its end not yet stored
    assert [c.state for c in await gl_cp.session_cells("s1")] == [CellState.OK]
    commits = gl_cp.store.commits  # type: ignore[attr-defined]
    for n in range(2, 12):
        assert (await run(gl_cp, "s1", "y += 1; y")).cell.number == n
    # Ten starts, each with the end before it: ten commits (19 when each end took its own).
    assert gl_cp.store.commits - commits <= 11  # type: ignore[attr-defined]
    stored = await gl_cp.store.get_cell(info.id, 10)
    assert stored is not None and stored.state == CellState.OK
