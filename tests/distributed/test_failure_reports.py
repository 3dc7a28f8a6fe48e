"""A gang's failures read like the user's own: the rank's traceback once, no launcher dump.

torchrun's own lines (its ChildFailedError report, a SignalException on cancel, the exit-barrier
error of a finished multi-node job) stay out of the log unless the job sets
``GPULAYER_LAUNCHER_LOGS=1``; a failed gang says how to see them in one ``system`` line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import JobState
from gpulayer_kernel.controlplane import ControlPlane

from ..conftest import WorkerFactory
from .conftest import PY, command_spec, lines, needs_torch, rank_pids, run_to_end

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    needs_torch,
    pytest.mark.usefixtures("no_leftovers"),
    pytest.mark.skipif(sys.platform != "linux", reason="gang jobs need Linux (/proc, setpriv)"),
]

Records = list[tuple[str, int | None, str]]


def launcher_lines(records: Records) -> list[str]:
    return [t for s, r, t in records if s != "system" and r is None]


async def test_a_failing_gang_shows_the_rank_traceback_once_and_no_launcher_dump(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=2)
    spec = command_spec([PY, str(scripts / "raise_rank.py")], gpus=2, env={"FAIL_RANK": "1"})
    job = await run_to_end(gl_cp, spec)
    assert job.state == JobState.FAILED and job.reason is not None
    assert job.reason.startswith("rank 1 on w1 exited with code 1; last lines of rank 1:")
    records = await lines(gl_cp, job.id)
    texts = [t for _, _, t in records]
    assert launcher_lines(records) == []
    assert not any("ChildFailedError" in t or "Root Cause" in t for t in texts)
    assert texts.count("Traceback (most recent call last):") == 1
    assert [r for s, r, t in records if t == "ValueError: boom in rank 1"] == [1]
    notes = [t for s, _, t in records if s == "system" and "GPULAYER_LAUNCHER_LOGS=1" in t]
    assert len(notes) == 1 and "not shown" in notes[0]


async def test_the_launcher_report_is_there_on_request(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=2)
    env = {"FAIL_RANK": "1", "GPULAYER_LAUNCHER_LOGS": "1"}
    job = await run_to_end(
        gl_cp, command_spec([PY, str(scripts / "raise_rank.py")], gpus=2, env=env)
    )
    assert job.state == JobState.FAILED
    records = await lines(gl_cp, job.id)
    assert any("ChildFailedError" in t for t in launcher_lines(records))
    assert not any("GPULAYER_LAUNCHER_LOGS=1" in t for s, _, t in records if s == "system")


async def test_a_cancelled_gang_is_cancelled_with_no_traceback(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=2)
    job = await gl_cp.submit(command_spec([PY, str(scripts / "sleepy.py")], gpus=2))
    since, deadline, pids = 0, time.monotonic() + 60, {}
    while len(pids) < 2 and time.monotonic() < deadline:
        page = await gl_cp.logs(job.id, since=since, wait=5.0)
        since = page.next_since
        pids.update(rank_pids([(r.stream, r.rank, r.text) for r in page.records]))
    await gl_cp.cancel(job.id)
    done = await gl_cp.wait(job.id, timeout=30)
    # The one convention for a stopped job: 128 + SIGTERM (it ended within the kill grace).
    assert (done.state, done.exit_code, done.reason) == (
        JobState.CANCELLED,
        143,
        "cancelled by user",
    )
    texts = [t for _, _, t in await lines(gl_cp, job.id)]
    assert not any("SignalException" in t or "Traceback" in t for t in texts), texts


async def test_a_successful_multi_node_gang_logs_nothing_of_torchrun(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=1, advertise_addr="127.0.0.1")
    await gl_worker(name="w2", gpus=1, advertise_addr="127.0.0.1")
    job = await run_to_end(gl_cp, command_spec([PY, str(scripts / "outputs.py")], gpus=1, nodes=2))
    assert job.state == JobState.SUCCEEDED, job.reason
    records = await lines(gl_cp, job.id)
    assert launcher_lines(records) == []  # e.g. no exit-barrier error from the other node
    assert not any("barrier" in t.lower() or "not shown" in t for _, _, t in records)
    assert set(rank_pids(records)) == {0, 1}
