"""A job's whole life through a real ControlPlane, SQLite store and in-process worker."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import (
    CommandWorkload,
    JobSpec,
    JobState,
    PythonWorkload,
    Resources,
    WorkerState,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import Conflict, InvalidInput, NotFound
from gpulayer_kernel.store import LocalArtifactStore, SqliteStore
from gpulayer_kernel.testing import FakeClock, until

from ..conftest import WorkerFactory, pid_alive

PY = sys.executable


def cmd(*argv: str, **kw: object) -> JobSpec:
    return JobSpec(workload=CommandWorkload(argv=list(argv)), **kw)  # type: ignore[arg-type]


async def job_is(cp: ControlPlane, job_id: str, state: JobState) -> bool:
    return (await cp.get(job_id)).state == state


async def is_running(cp: ControlPlane, job_id: str) -> bool:
    return await job_is(cp, job_id, JobState.RUNNING)


async def texts(cp: ControlPlane, job_id: str, stream: str | None = None) -> list[str]:
    page = await cp.logs(job_id, limit=5000)
    return [r.text for r in page.records if stream is None or r.stream == stream]


async def test_hello_from_a_worker(gl_cp: ControlPlane, gl_worker: WorkerFactory) -> None:
    await gl_worker()
    job = await gl_cp.submit(cmd(PY, "-c", "print('hello from a worker')"))
    assert job.state == JobState.QUEUED
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED
    assert done.exit_code == 0
    assert done.placement is not None and done.placement.nodes[0].worker_name == "w1"
    assert done.started_at and done.finished_at and done.finished_at >= done.started_at
    assert await texts(gl_cp, job.id, "stdout") == ["hello from a worker"]
    assert any("placed on w1" in t for t in await texts(gl_cp, job.id, "system"))


async def test_failing_command_reports_its_exit_code_and_stderr(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    job = await gl_cp.submit(cmd("sh", "-c", "echo oops >&2; exit 7"))
    done = await gl_cp.wait(job.id, timeout=30)
    assert (done.state, done.exit_code, done.reason) == (JobState.FAILED, 7, "exited with code 7")
    assert await texts(gl_cp, job.id, "stderr") == ["oops"]


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["no-such-command-xyz"], "command not found: no-such-command-xyz"),
        (["./missing.sh"], "command not found: ./missing.sh"),
    ],
)
async def test_a_command_that_does_not_exist_fails_with_that_reason(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, argv: list[str], reason: str
) -> None:
    await gl_worker()
    job = await gl_cp.submit(cmd(*argv))
    done = await gl_cp.wait(job.id, timeout=10)
    assert done.state == JobState.FAILED
    assert done.exit_code == 127
    assert done.reason is not None and done.reason.startswith(reason)


async def test_a_missing_workdir_fails_clearly(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, tmp_path: Path
) -> None:
    await gl_worker()
    job = await gl_cp.submit(cmd("true", workdir=str(tmp_path / "nope")))
    done = await gl_cp.wait(job.id, timeout=10)
    assert done.state == JobState.FAILED
    assert done.reason is not None and "does not exist on worker w1" in done.reason


async def test_timeout_kills_the_job_and_says_so(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(kill_grace=0.5)
    job = await gl_cp.submit(cmd("sleep", "30", timeout=0.5))
    done = await gl_cp.wait(job.id, timeout=15)
    assert done.state == JobState.FAILED
    assert done.reason is not None and "timed out after 0.5s" in done.reason


async def _pid_of(cp: ControlPlane, job_id: str) -> int:
    since = 0
    while True:
        page = await cp.logs(job_id, since=since, wait=10)
        since = page.next_since
        for r in page.records:
            if r.text.startswith("pid "):
                return int(r.text.split()[1])
        assert not page.state.terminal, await texts(cp, job_id)


SPAWNER = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('pid', child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


async def test_cancel_stops_the_whole_process_group(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(kill_grace=1.0)
    job = await gl_cp.submit(cmd(PY, "-c", SPAWNER))
    child = await _pid_of(gl_cp, job.id)
    assert pid_alive(child)
    await gl_cp.cancel(job.id)
    done = await gl_cp.wait(job.id, timeout=15)
    assert done.state == JobState.CANCELLED
    assert done.reason == "cancelled by user"
    await until(lambda: not pid_alive(child), 5, what="the job's child process to stop")


async def test_children_left_behind_by_a_finished_job_are_stopped(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    script = (
        "import subprocess, sys\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('pid', c.pid, flush=True)\n"
    )
    job = await gl_cp.submit(cmd(PY, "-c", script))
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED
    child = int((await texts(gl_cp, job.id, "stdout"))[0].split()[1])
    await until(lambda: not pid_alive(child), 5, what="the left-behind child to be stopped")


async def test_cancel_a_queued_job_and_cancel_is_idempotent(gl_cp: ControlPlane) -> None:
    job = await gl_cp.submit(cmd("true"))  # no worker: stays queued
    cancelled = await gl_cp.cancel(job.id)
    assert cancelled.state == JobState.CANCELLED
    assert (await gl_cp.cancel(job.id)).state == JobState.CANCELLED
    assert (await gl_cp.get(job.id)).state == JobState.CANCELLED


async def test_wait_with_timeout_returns_the_current_state(gl_cp: ControlPlane) -> None:
    job = await gl_cp.submit(cmd("true"))
    start = time.monotonic()
    got = await gl_cp.wait(job.id, timeout=0.2)
    assert got.state == JobState.QUEUED
    assert time.monotonic() - start < 2


async def test_log_long_poll_wakes_when_a_line_arrives(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    job = await gl_cp.submit(
        cmd(PY, "-c", "import time; time.sleep(0.5); print('late', flush=True); time.sleep(0.5)")
    )
    since = 0
    start = time.monotonic()
    while True:
        page = await gl_cp.logs(job.id, since=since, wait=20)
        since = page.next_since
        if any(r.text == "late" for r in page.records):
            break
        assert not page.state.terminal
    # Woken by the line itself, long before the 20 s wait ran out.
    assert time.monotonic() - start < 10


async def test_ids_resolve_by_unique_prefix(gl_cp: ControlPlane) -> None:
    job = await gl_cp.submit(cmd("true"))
    assert (await gl_cp.get(job.id[:6])).id == job.id
    with pytest.raises(NotFound):
        await gl_cp.get("ffffffffffff0")
    with pytest.raises(InvalidInput, match="too short"):
        await gl_cp.get("ab")


async def test_retries_are_opt_in_and_counted(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    once = await gl_cp.wait((await gl_cp.submit(cmd("false"))).id, timeout=30)
    assert (once.state, once.attempts) == (JobState.FAILED, 0)
    job = await gl_cp.submit(cmd("false", retries=2, retry_on=["failed"], retry_backoff=0))
    done = await gl_cp.wait(job.id, timeout=30)
    assert (done.state, done.attempts) == (JobState.FAILED, 2)
    assert sum("retrying" in t for t in await texts(gl_cp, job.id, "system")) == 2


async def test_python_function_workload_returns_json(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    digest, data = bundles.build(
        {"mathjob.py": b"def add(a, b):\n    print('adding', a, b)\n    return {'sum': a + b}\n"}
    )
    await gl_cp.put_bundle(data, digest)
    spec = JobSpec(
        workload=PythonWorkload(bundle=digest, entrypoint="mathjob:add", args={"a": 2, "b": 3})
    )
    done = await gl_cp.wait((await gl_cp.submit(spec)).id, timeout=30)
    assert done.state == JobState.SUCCEEDED, await texts(gl_cp, done.id)
    assert done.result == {"sum": 5}
    assert await texts(gl_cp, done.id, "stdout") == ["adding 2 3"]


async def test_a_result_that_is_not_json_fails_the_job_clearly(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    digest, data = bundles.build({"m.py": b"def f():\n    return {1, 2}\n"})
    await gl_cp.put_bundle(data, digest)
    spec = JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="m:f"))
    done = await gl_cp.wait((await gl_cp.submit(spec)).id, timeout=30)
    assert done.state == JobState.FAILED
    err = " ".join(await texts(gl_cp, done.id, "stderr"))
    assert "not JSON" in err and "artifact" in err


async def test_submit_refuses_a_bundle_that_was_never_uploaded(gl_cp: ControlPlane) -> None:
    spec = JobSpec(workload=PythonWorkload(bundle="a" * 64, entrypoint="m:f"))
    with pytest.raises(NotFound, match="has not been uploaded"):
        await gl_cp.submit(spec)


async def test_traceback_points_into_user_code(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    digest, data = bundles.build({"boom.py": b"def f():\n    x = 1\n    raise ValueError('bad')\n"})
    await gl_cp.put_bundle(data, digest)
    spec = JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="boom:f"))
    done = await gl_cp.wait((await gl_cp.submit(spec)).id, timeout=30)
    assert done.state == JobState.FAILED
    err = "\n".join(await texts(gl_cp, done.id, "stderr"))
    assert 'boom.py", line 3' in err and "ValueError: bad" in err
    assert "gpulayer_kernel" not in err


async def test_artifacts_written_to_output_are_kept(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    script = (
        "import os, pathlib\npathlib.Path(os.environ['GPULAYER_OUTPUT'], 'm.txt').write_text('42')"
    )
    done = await gl_cp.wait((await gl_cp.submit(cmd(PY, "-c", script))).id, timeout=30)
    assert done.state == JobState.SUCCEEDED
    [art] = done.artifacts
    assert (art.name, art.size) == ("m.txt", 2)
    assert await gl_cp.get_blob(art.digest) == b"42"
    assert (await gl_cp.artifact_for(done.id, "m.txt")).digest == art.digest


async def test_environment_is_allow_listed(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_TOKEN", "worker-secret-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    await gl_worker()
    script = (
        "import os\n"
        "for k in ('GPULAYER_TOKEN', 'AWS_SECRET_ACCESS_KEY', 'MINE', 'PATH', 'GPULAYER_JOB_ID'):\n"
        "    print(k, k in os.environ)\n"
    )
    done = await gl_cp.wait(
        (await gl_cp.submit(cmd(PY, "-c", script, env={"MINE": "1"}))).id, timeout=30
    )
    lines = await texts(gl_cp, done.id, "stdout")
    assert lines == [
        "GPULAYER_TOKEN False",
        "AWS_SECRET_ACCESS_KEY False",
        "MINE True",
        "PATH True",
        "GPULAYER_JOB_ID True",
    ]


async def test_secrets_reach_the_job_and_are_redacted_from_logs(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    await gl_cp.set_secret("HF_TOKEN", "hf_supersecret123")
    script = (
        "import os, sys\n"
        "s = os.environ['HF_TOKEN']\n"
        "print('token is', s)\n"
        "sys.stdout.write(s[:5]); sys.stdout.flush(); sys.stdout.write(s[5:] + '\\n')\n"
    )
    done = await gl_cp.wait(
        (await gl_cp.submit(cmd(PY, "-c", script, secrets=["HF_TOKEN"]))).id, timeout=30
    )
    assert done.state == JobState.SUCCEEDED
    assert await texts(gl_cp, done.id, "stdout") == ["token is ***", "***"]
    assert "hf_supersecret123" not in done.model_dump_json()


async def test_a_job_needing_an_unset_secret_fails_with_the_name(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker()
    done = await gl_cp.wait((await gl_cp.submit(cmd("true", secrets=["NOPE"]))).id, timeout=10)
    assert done.state == JobState.FAILED
    assert done.reason is not None and "NOPE" in done.reason


@pytest.mark.gl_fake_clock
async def test_a_silent_worker_is_lost_and_its_job_with_it(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, gl_clock: FakeClock
) -> None:
    agent = await gl_worker()
    job = await gl_cp.submit(cmd("sleep", "30"))
    await until(lambda: is_running(gl_cp, job.id), what="the job to run")
    # The worker process "dies": its loops stop and it never heartbeats again.
    for t in agent._loops:
        t.cancel()

    async def lost() -> bool:  # the heartbeat timeout is 2 s (of the fake clock)
        await gl_clock.advance(0.5)
        return await job_is(gl_cp, job.id, JobState.LOST)

    await until(lost, 20, what="the job to be lost")
    done = await gl_cp.get(job.id)
    assert done.state == JobState.LOST
    assert done.reason is not None and "no heartbeat" in done.reason
    [w] = await gl_cp.workers()
    assert w.state == WorkerState.LOST
    for ex in list(agent.running.values()):
        ex.cancel()


async def test_restart_marks_in_process_jobs_lost_and_keeps_finished_ones(
    tmp_path: Path, gl_worker: WorkerFactory, gl_cp: ControlPlane
) -> None:
    await gl_worker()
    ok = await gl_cp.wait((await gl_cp.submit(cmd("echo", "kept"))).id, timeout=30)
    running = await gl_cp.submit(cmd("sleep", "30"))
    await until(lambda: is_running(gl_cp, running.id), what="the job to run")
    # A second control plane on the same file, as after a crash of the first host process.
    store = SqliteStore(tmp_path / "cp.db")
    await store.open()
    cp2 = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"))
    await cp2.start()
    try:
        assert (await cp2.get(running.id)).state == JobState.LOST
        kept = await cp2.get(ok.id)
        assert kept.state == JobState.SUCCEEDED
        assert [r.text for r in (await cp2.logs(ok.id)).records if r.stream == "stdout"] == ["kept"]
    finally:
        await cp2.close()
        await store.close()


async def test_worker_reports_for_jobs_it_does_not_own_are_refused(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    a = await gl_worker("a")
    await gl_worker("b")
    job = await gl_cp.submit(cmd("sleep", "5", resources=Resources(worker="b")))
    await until(lambda: is_running(gl_cp, job.id), what="the job to run")
    assert a.info is not None
    with pytest.raises(Conflict):
        await gl_cp.append_logs(a.info.id, job.id, [])
    await gl_cp.cancel(job.id)
    await gl_cp.wait(job.id, timeout=15)


async def test_events_follow_job_changes(gl_cp: ControlPlane, gl_worker: WorkerFactory) -> None:
    first = await gl_cp.events()
    await gl_worker()
    job = await gl_cp.submit(cmd("true"))
    await gl_cp.wait(job.id, timeout=30)
    page = await gl_cp.events(since=first.next_since)
    states = [e.job.state for e in page.events if e.job is not None and e.job.id == job.id]
    assert states[0] == JobState.QUEUED and states[-1] == JobState.SUCCEEDED
    assert JobState.RUNNING in states
    assert any(e.kind == "worker" for e in page.events)
    assert page.next_since > first.next_since


async def test_a_placed_job_whose_worker_is_gone_at_restart_is_lost(tmp_path: Path) -> None:
    from gpulayer_kernel.contracts import Job, NodePlacement, Placement

    store = SqliteStore(tmp_path / "db")
    await store.open()
    placement = Placement(nodes=[NodePlacement(worker_id="ghost", worker_name="ghost")])
    stuck = Job(
        id="stuckjob0001",
        seq=1,
        spec=cmd("true"),
        state=JobState.PLACED,
        placement=placement,
        submitted_at=time.time(),
    )
    await store.save_jobs([stuck])
    cp = ControlPlane(store, LocalArtifactStore(tmp_path / "blobs"))
    await cp.start()
    try:
        job = await cp.get("stuckjob0001")
        assert job.state == JobState.LOST
        assert job.reason is not None and "gone when the control plane restarted" in job.reason
    finally:
        await cp.close()
        await store.close()


async def test_events_after_a_restart_ask_the_client_to_refetch(gl_cp: ControlPlane) -> None:
    page = await gl_cp.events(since=10_000)
    assert page.reset and page.next_since < 10_000


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
@pytest.mark.gl_fake_clock
async def test_a_waiting_gang_reserves_devices_without_any_other_event(
    tmp_path: Path, gl_worker: WorkerFactory, gl_cp: ControlPlane, gl_clock: FakeClock
) -> None:
    gl_cp.reserve_after = 0.3
    await gl_worker(gpus=2)
    small = await gl_cp.submit(cmd("sleep", "30", resources=Resources(gpus=1)))
    await until(lambda: is_running(gl_cp, small.id), what="the small job to run")
    gang = await gl_cp.submit(cmd("true", resources=Resources(gpus=2)))

    async def reserved() -> bool:
        report = (await gl_cp.get(gang.id)).pending
        return report is not None and bool(report.reservation)

    assert not await reserved()
    await gl_clock.advance(0.5)  # past reserve_after: only the reservation timer fires
    await until(reserved, 5, what="the gang's reservation")
    await gl_cp.cancel(small.id)
    done = await gl_cp.wait(gang.id, timeout=20)
    assert done.state == JobState.SUCCEEDED
