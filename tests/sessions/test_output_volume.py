"""Output volume in a session over HTTP (issue 23): a cell printing 100 MB ends, its output cut
with one note saying so; an interrupt works while a cell floods; the session stays usable.
Real processes: ``gpulayer serve`` and an HTTP ``gpulayer worker``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpulayer_kernel.contracts import CellRequest, CellState, SessionStatus
from gpulayer_kernel.contracts.limits import CELL_OUTPUT_CAP, CELL_OUTPUT_LINES
from gpulayer_kernel.display import human_bytes
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until

from .conftest import HOLDER, spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("session-volume")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    with ServeProcess(root / "home", heartbeat_timeout=30, env=env) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=root / "w1", env=env):
            yield server


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> Iterator[Any]:
    with server.client(timeout=120) as c:
        c.start_session(spec())
        wait_until(lambda: c.get_session("s1").status == SessionStatus.IDLE, 60)
        yield c


def run(c: Any, code: str, timeout: float = 120) -> Any:
    """One cell to its end, with all its records."""
    page = c.run_cell("s1", CellRequest(code=code, client=HOLDER.client), wait=30)
    records = list(page.records)
    deadline = time.monotonic() + timeout
    while not page.finished:  # an ended cell's last pages may still be unread (``more``)
        assert time.monotonic() < deadline, f"cell {page.cell.number} still {page.cell.state}"
        page = c.follow_cell("s1", page.cell.number, page.next_since, wait=30)
        records += page.records
    return page.model_copy(update={"records": records})


def notes(page: Any) -> list[str]:
    return [r.text for r in page.records if r.text.startswith("[gpulayer]")]


def test_a_cell_printing_100_mb_in_one_line_is_cut_with_a_note(client: Any) -> None:
    page = run(client, "x = 7\nprint('x' * 100_000_000)\nx * 6")
    assert page.cell.state == CellState.OK, page.cell
    assert page.cell.value["data"]["text/plain"] == "42"
    kept = sum(len(r.text) for r in page.records if r.stream == "stdout")
    assert CELL_OUTPUT_CAP // 2 <= kept <= CELL_OUTPUT_CAP
    (note,) = notes(page)
    assert f"of output dropped: a cell's output is capped at {human_bytes(CELL_OUTPUT_CAP)}" in note


def test_a_cell_printing_many_lines_is_cut_with_a_note(client: Any) -> None:
    run(client, "x = 7")  # this test's own state (it runs alone with -k too)
    page = run(client, "for i in range(1_000_000):\n    print(i)\n'done'")
    assert page.cell.state == CellState.OK, page.cell
    assert page.cell.value["data"]["text/plain"] == "'done'"
    out = [r.text for r in page.records if r.stream == "stdout"]
    assert out == [str(i) for i in range(len(out))] and len(out) == CELL_OUTPUT_LINES
    (note,) = notes(page)
    assert "900,000 lines" in note and "100,000 lines" in note, note
    # The next cell runs, sees the session's state, and prints in full.
    after = run(client, "print(x)")
    assert [r.text for r in after.records] == ["7"] and not notes(after)


def test_an_interrupt_stops_a_cell_flooding_its_output(client: Any) -> None:
    run(client, "kept = 'yes'")
    page = client.run_cell(
        "s1",
        CellRequest(code="while True:\n    print('spam ' * 20)", client=HOLDER.client),
        wait=3,
    )
    assert page.cell.state == CellState.RUNNING
    client.interrupt_session("s1")
    deadline = time.monotonic() + 60
    while not page.cell.state.done:
        assert time.monotonic() < deadline, "the interrupted cell did not end"
        page = client.follow_cell("s1", page.cell.number, page.next_since, wait=30)
    assert page.cell.state == CellState.ERROR and page.cell.error.ename == "KeyboardInterrupt"
    after = run(client, "kept, x")
    assert after.cell.value["data"]["text/plain"] == "('yes', 7)"


LINES = 12_000  # more than one page of a cell's records (``PAGE``): the follower reads several


@pytest.mark.parametrize("caller", ["python", "magic"])
def test_a_cell_that_ended_before_its_output_was_read_still_shows_every_line(
    server: ServeProcess, client: Any, caller: str
) -> None:
    """Issue 32, item 11: a follower that learns of the cell's end with pages still unread reads
    on to the last line (a page says ``more``), through the Python API and the magic alike."""
    from gpulayer_kernel.jupyter.bridge import Bridge, Target
    from gpulayer_kernel.jupyter.sessions.cells import drive
    from gpulayer_kernel.sessions import SessionHandle

    shown: list[str] = []

    def show(records: Any) -> None:
        if not shown:  # hold the follower until the cell has ended: pages are left unread
            number = records[0].cell
            wait_until(lambda: client.session_cells("s1", limit=1)[0].number == number, 60)
            wait_until(lambda: client.session_cells("s1", limit=1)[0].state.done, 60)
        shown.extend(r.text for r in records if r.stream == "stdout")

    code = f"print('\\n'.join(map(str, range({LINES}))))\n'end'"
    bridge = Bridge(Target(url=server.url, token=server.admin_token))
    try:
        handle = SessionHandle(bridge, client.get_session("s1"), HOLDER.client)
        if caller == "python":
            result = handle.run(code, on_records=show)
        else:
            result = drive(handle, code, show=show)
    finally:
        bridge.close()
    assert result.cell.state == CellState.OK, result.cell
    assert shown == [str(i) for i in range(LINES)]
