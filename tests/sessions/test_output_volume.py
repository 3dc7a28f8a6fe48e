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
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("session-volume")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    with ServeProcess(root / "home", heartbeat_timeout=30, env=env) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=root / "w1", env=env):
            with server.client(timeout=120) as c:
                c.start_session(spec())
                wait_until(lambda: c.get_session("s1").status == SessionStatus.IDLE, 60)
                yield c


def run(c: Any, code: str, timeout: float = 120) -> Any:
    """One cell to its end, with all its records."""
    page = c.run_cell("s1", CellRequest(code=code, client=HOLDER.client), wait=30)
    records = list(page.records)
    deadline = time.monotonic() + timeout
    while not page.cell.state.done:
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
