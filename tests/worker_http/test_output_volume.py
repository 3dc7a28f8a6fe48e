"""Output volume never fails work (issue 23): chatty, huge-line and binary jobs on a served control
plane (``gpulayer serve`` + ``gpulayer worker`` processes) succeed, their logs whole or capped
with one note, and neither process's memory grows with the output."""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections.abc import Iterator

import psutil  # type: ignore[import-untyped]
import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec
from gpulayer_kernel.contracts.limits import JOB_LOG_CAP, LINE_PIECE, dropped_note
from gpulayer_kernel.testing import ServeProcess, WorkerProcess

pytestmark = pytest.mark.slow
PY = sys.executable
MIB = 1 << 20


class Peak:
    """The highest RSS of some processes, sampled every 50 ms while it runs."""

    def __init__(self, *pids: int) -> None:
        self.procs = [psutil.Process(p) for p in pids]
        self.idle = [p.memory_info().rss for p in self.procs]
        self.peak = list(self.idle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for i, p in enumerate(self.procs):
                self.peak[i] = max(self.peak[i], p.memory_info().rss)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def growth(self) -> list[int]:
        return [p - i for p, i in zip(self.peak, self.idle, strict=True)]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, WorkerProcess]]:
    root = tmp_path_factory.mktemp("volume")
    with ServeProcess(root / "home", heartbeat_timeout=30) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=root / "w1") as worker:
            yield server, worker


def run(
    server: ServeProcess, script: str, timeout: float = 240
) -> tuple[str, list[tuple[str, str]]]:
    """``script`` run as a one-shot job: its end state (with its reason when it did not succeed)
    and its log (stream, text), stored."""
    with server.client(timeout=60) as c:
        job = c.submit(JobSpec(workload=CommandWorkload(argv=[PY, "-c", script])))
        done = c.wait(job.id, timeout=timeout)
    (db,) = [p for p in server.home.rglob("*.db") if p.stat().st_size]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute(
            "SELECT seq, stream, text FROM logs WHERE job_id = ? ORDER BY seq", (job.id,)
        ).fetchall()
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))  # no gap, nothing twice
    state = done.state.value
    if state != "succeeded":  # why, for the reader of a failed run: the reason and what was said
        said = [t for _, s, t in rows if s == "system"][-5:]
        state = f"{state}: {done.reason}; {said}; the server said: {server.output()[-1500:]}"
    return state, [(s, t) for _, s, t in rows]


def test_a_million_short_lines(plane: tuple[ServeProcess, WorkerProcess]) -> None:
    server, worker = plane
    script = "import sys\nw = sys.stdout.write\nfor i in range(1_000_000):\n    w(f'{i}\\n')\n"
    with Peak(worker.pid, server.pid) as peak:
        state, rows = run(server, script)
    assert state == "succeeded"
    out = [t for s, t in rows if s == "stdout"]
    assert out == [str(i) for i in range(1_000_000)]  # kept in full, in order, once each
    grew = peak.growth()
    print(f"RSS growth, 1M lines: worker {grew[0] / MIB:.0f} MiB, server {grew[1] / MIB:.0f} MiB")
    assert max(grew) < 300 * MIB, grew


def test_one_fifty_mib_line(plane: tuple[ServeProcess, WorkerProcess]) -> None:
    server, _ = plane
    script = "import sys\nsys.stdout.write('0123456789abcdef' * (50 << 16) + '\\nend\\n')\n"
    state, rows = run(server, script)
    assert state == "succeeded"
    out = [t for s, t in rows if s == "stdout"]
    assert out[-1] == "end" and all(len(t) <= LINE_PIECE for t in out)
    assert "".join(out[:-1]) == "0123456789abcdef" * (50 << 16)


def test_binary_garbage(plane: tuple[ServeProcess, WorkerProcess]) -> None:
    server, _ = plane
    script = (
        "import os, sys\n"
        "for _ in range(8):\n"
        "    sys.stdout.buffer.write(os.urandom(1 << 20))\n"
        "sys.stdout.buffer.write(b'\\xff\\x00\\n')\n"
        "print('end', flush=True)\n"
    )
    state, rows = run(server, script)
    assert state == "succeeded"
    out = [t for s, t in rows if s == "stdout"]
    assert out[-1] == "end" and len(out) > 1000 and all(len(t) <= LINE_PIECE for t in out)


def test_past_the_cap_one_line_says_what_was_dropped(
    plane: tuple[ServeProcess, WorkerProcess],
) -> None:
    server, _ = plane
    line = "x" * 1023  # 1 KiB a line with its newline: 80 MiB in all
    script = f"import sys\nfor i in range(80 << 10):\n    print({line!r})\nprint('done')\n"
    state, rows = run(server, script)
    assert state == "succeeded"
    out = [t for s, t in rows if s == "stdout"]
    kept = sum(len(t) for t in out)
    assert JOB_LOG_CAP - 1024 <= kept <= JOB_LOG_CAP and "done" not in out
    notes = [t for s, t in rows if t.startswith("[gpulayer]")]
    assert len(notes) == 1, notes
    dropped, size = (80 << 10) + 1 - len(out), (80 << 10) * 1023 + len("done") - kept
    assert notes[0] == dropped_note(dropped, size, JOB_LOG_CAP, "this job's log")
