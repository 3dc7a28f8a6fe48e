"""Gang jobs on one worker: torchrun with N ranks on simulated GPUs, end to end.

Real processes throughout (torchrun, one process per rank); the scripts that need no collective
skip ``import torch`` in the ranks, which costs ~2 s each on a small machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import JobSpec, JobState, PythonWorkload, Reason, Resources
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.worker import ports

from ..conftest import WorkerFactory
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


def test_gpulayer_run_allreduce_on_two_simulated_gpus(tmp_path: Path) -> None:
    """The done criterion: ``gpulayer run --gpus 2 -- python examples/allreduce.py``."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPULAYER_URL", "GPULAYER_TOKEN")}
    env.update(GPULAYER_HOME=str(tmp_path / "home"), GPULAYER_SIMULATE_GPUS="2")
    done = subprocess.run(
        [
            PY,
            "-m",
            "gpulayer_kernel.cli",
            "run",
            "--gpus",
            "2",
            "--",
            "python",
            "examples/allreduce.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    assert "[rank 0] rank 0: sum = 3" in out and "[rank 1] rank 1: sum = 3" in out
    assert "torchrun: ranks 0-1 of 2 here (node 0 of 1)" in done.stderr


async def test_ranks_write_artifacts_by_rank_and_rank0_gives_the_result(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=2)
    job = await run_to_end(gl_cp, command_spec([PY, str(scripts / "outputs.py")], gpus=2))
    assert job.state == JobState.SUCCEEDED, job.reason
    assert job.result == {"rank": 0, "world": 2}
    assert sorted((a.name, a.rank) for a in job.artifacts) == [
        ("rank0/hello.txt", 0),
        ("rank1/hello.txt", 1),
    ]
    for a in job.artifacts:
        assert await gl_cp.get_blob(a.digest) == f"from rank {a.rank}".encode()
    records = await lines(gl_cp, job.id)
    assert set(rank_pids(records)) == {0, 1}
    assert {
        (rank, text.split(" world")[0].split(" ", 2)[2])
        for _, rank, text in records
        if text.startswith("pid ")
    } == {(0, "rank 0"), (1, "rank 1")}


async def test_every_rank_finds_its_output_directory(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, tmp_path: Path
) -> None:
    """``$GPULAYER_OUTPUT/rank<R>`` exists for each rank before its first line: no mkdir."""
    await gl_worker(name="w1", gpus=2)
    script = (
        "import os\n"
        "out = os.environ['GPULAYER_OUTPUT']\n"
        "open(os.path.join(out, 'mine.txt'), 'w').write(os.environ['RANK'])\n"
    )
    job = await run_to_end(gl_cp, command_spec([PY, "-c", script], gpus=2, workdir=tmp_path))
    assert job.state == JobState.SUCCEEDED, job.reason
    assert sorted((a.name, a.rank) for a in job.artifacts) == [
        ("rank0/mine.txt", 0),
        ("rank1/mine.txt", 1),
    ]


async def test_a_failing_rank_stops_the_gang_fast_and_is_never_retried(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=2)
    spec = command_spec(
        [PY, str(scripts / "raise_rank.py")], gpus=2, retries=3, env={"FAIL_RANK": "1"}
    )
    job = await run_to_end(gl_cp, spec)
    assert job.state == JobState.FAILED and job.attempts == 0  # retries=3 ignored: a gang
    assert job.reason is not None
    head, *quoted = job.reason.splitlines()
    assert head == "rank 1 on w1 exited with code 1; last lines of rank 1:"
    assert quoted[0] == "  Traceback (most recent call last):"
    assert "in explode" in job.reason and quoted[-1] == "  ValueError: boom in rank 1"
    records = await lines(gl_cp, job.id)
    pids = rank_pids(records)
    assert set(pids) == {0, 1}
    assert not any(pid_alive(p) for p in pids.values())  # rank 0 (asleep) was stopped too
    failed_at = next(
        r.time
        for r in (await gl_cp.logs(job.id, limit=5000)).records
        if r.rank == 1 and r.text.startswith("ValueError")
    )
    assert job.finished_at is not None and job.finished_at - failed_at < 5.0
    assert ("stderr", 1, "ValueError: boom in rank 1") in records


async def test_a_notebook_cell_runs_as_a_gang_and_rank0_value_is_the_result(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    """The ``%%gpulayer --gpus 2`` path: a bundled cell under torchrun, via the runner."""
    await gl_worker(name="w1", gpus=2)
    cell = (
        b"import os\nr = int(os.environ['RANK'])\nprint(f'cell on rank {r}')\n{'rank': r, 'n': n}\n"
    )
    digest, data = bundles.build({"cell.py": cell})
    await gl_cp.put_bundle(data, digest)
    spec = JobSpec(
        workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py", args={"n": 7}),
        resources=Resources(gpus=2),
    )
    job = await run_to_end(gl_cp, spec)
    assert job.state == JobState.SUCCEEDED, job.reason
    assert job.result == {"rank": 0, "n": 7}
    records = await lines(gl_cp, job.id)
    assert ("stdout", 0, "cell on rank 0") in records and ("stdout", 1, "cell on rank 1") in records


async def test_cancelling_a_gang_stops_every_rank(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    """torchrun starts each rank in a session of its own: stopping the job's process group alone
    would orphan them; the worker must still stop them all."""
    await gl_worker(name="w1", gpus=2)
    job = await gl_cp.submit(command_spec([PY, str(scripts / "sleepy.py")], gpus=2))
    since, deadline, pids = 0, time.monotonic() + 60, {}
    while len(pids) < 2 and time.monotonic() < deadline:
        page = await gl_cp.logs(job.id, since=since, wait=5.0)
        since = page.next_since
        pids.update(rank_pids([(r.stream, r.rank, r.text) for r in page.records]))
    assert set(pids) == {0, 1}
    await gl_cp.cancel(job.id)
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.CANCELLED
    assert not any(pid_alive(p) for p in pids.values())


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


async def test_a_taken_port_is_picked_again_not_a_hang(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await gl_worker(name="w1", gpus=2)
    with _listener() as taken:
        busy, free = taken.getsockname()[1], ports.free_port()
        monkeypatch.setenv(ports.PORTS_ENV, f"{busy},{free}")
        job = await run_to_end(gl_cp, command_spec([PY, str(scripts / "outputs.py")], gpus=2))
        assert job.state == JobState.SUCCEEDED, job.reason
        texts = [t for _, _, t in await lines(gl_cp, job.id)]
        assert texts.count(f"master 127.0.0.1:{free}") == 2
        assert any(t.endswith(f"rendezvous at 127.0.0.1:{free}") for t in texts)
        # Nothing free at all: the job fails at once, saying so, instead of hanging.
        monkeypatch.setenv(ports.PORTS_ENV, f"{busy}")
        started = time.monotonic()
        job = await run_to_end(gl_cp, command_spec([PY, str(scripts / "outputs.py")], gpus=2))
        assert job.state == JobState.FAILED and time.monotonic() - started < 10
        assert job.reason == f"no free port for the rendezvous on 127.0.0.1: tried {busy}"


async def _pending(cp: ControlPlane, job_id: str) -> dict[Reason, int]:
    for _ in range(100):
        job = await cp.get(job_id)
        if job.pending is not None:
            return {r.code: r.workers for r in [*job.pending.filtered, *job.pending.exhausted]}
        await cp.wait(job_id, timeout=0.05)
    raise AssertionError("no pending report")


async def test_more_gpus_than_any_worker_has_waits_and_says_why(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(name="w1", gpus=2)
    await gl_worker(name="w2", gpus=2)
    # It can never fit here: without wait_for_capacity it would fail at once (issue 12, item 15).
    job = await gl_cp.submit(command_spec(["true"], gpus=3, wait_for_capacity=True))
    assert await _pending(gl_cp, job.id) == {Reason.TOO_FEW_GPUS_TOTAL: 2}
    job = await gl_cp.get(job.id)
    assert job.state == JobState.QUEUED and job.pending is not None
    assert not job.pending.waiting_helps
    await gl_cp.cancel(job.id)


async def test_two_nodes_with_one_eligible_worker_waits_until_a_second_joins(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, scripts: Path
) -> None:
    await gl_worker(name="w1", gpus=1)
    spec = command_spec([PY, str(scripts / "outputs.py")], gpus=1, nodes=2, wait_for_capacity=True)
    job = await gl_cp.submit(spec)  # waits for capacity: one worker is too few (issue 12, 15)
    assert await _pending(gl_cp, job.id) == {Reason.TOO_FEW_NODES: 1}
    pending = (await gl_cp.get(job.id)).pending
    assert pending is not None and "needs 2 at once" in pending.sentence
    # Capacity that could fit it arrives: the gang is placed on both workers at once.
    await gl_worker(name="w2", gpus=1)
    done = await gl_cp.wait(job.id, timeout=60)
    assert done.state == JobState.SUCCEEDED, done.reason
    assert done.placement is not None
    assert sorted(n.worker_name for n in done.placement.nodes) == ["w1", "w2"]
