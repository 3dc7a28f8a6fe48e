"""``SlurmProvider`` against a real Slurm 22.05 (two slurmd nodes, 2 "GPUs" each) and, end to
end, a ``gpulayer serve`` whose autoscaler launches ``gpulayer worker`` as batch jobs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    InstanceState,
    JobSpec,
    JobState,
    Resources,
)
from gpulayer_kernel.errors import ConfigInvalid
from gpulayer_kernel.providers import LaunchSpec, SlurmProvider, parse_config
from gpulayer_kernel.providers.config import SlurmSettings
from gpulayer_kernel.testing import GL, ServeProcess, wait_until
from gpulayer_kernel.testing.slurm import SlurmCluster
from gpulayer_kernel.testing.waiting import until

from .conftest import run_two_gpu_job
from .conftest import served as serving

pytestmark = pytest.mark.slow


def settings(cluster: SlurmCluster, **partition: object) -> SlurmSettings:
    part = partition or {"price_per_gpu_hour": 2.1, "gpu_kind": "a100", "simulate": True}
    cfg = parse_config(
        {
            "providers": {
                "slurm": {
                    "kind": "slurm",
                    "slurm_conf": str(cluster.conf),
                    "gpulayer": [sys.executable, "-m", "gpulayer_kernel.cli"],
                    "time_limit": "5",
                    "partitions": {cluster.partition: part},
                }
            }
        }
    )
    s = cfg.providers["slurm"]
    assert isinstance(s, SlurmSettings)
    return s


async def test_offers_come_from_sinfo_at_the_partition_s_price(gl_slurm: SlurmCluster) -> None:
    p = SlurmProvider(settings(gl_slurm), owner="t00001")
    offers = await p.offers()
    assert [(o.name, o.gpus, o.price_per_hour) for o in offers] == [
        ("gpu-1gpu", 1, 2.1),
        ("gpu-2gpu", 2, 4.2),
    ]
    assert offers[0].labels == {"slurm.partition": "gpu"} and offers[0].max_hours == 5 / 60
    check = await p.check()
    assert check.ok and "Slurm 22.05" in check.detail


async def test_a_partition_with_gpus_and_no_price_is_refused_naming_the_field(
    gl_slurm: SlurmCluster,
) -> None:
    p = SlurmProvider(settings(gl_slurm, gpu_kind="a100"), owner="t00002")
    with pytest.raises(ConfigInvalid) as info:
        await p.offers()
    assert "providers.slurm.partitions.gpu.price_per_gpu_hour: field required" in info.value.message
    assert "0 for hardware that costs nothing" in info.value.hint


async def test_a_batch_job_is_launched_watched_and_cancelled(gl_slurm: SlurmCluster) -> None:
    p = SlurmProvider(settings(gl_slurm), owner="t00003")
    [one, _two] = await p.offers()
    how = LaunchSpec("0123456789ab", "slurm-test", "http://127.0.0.1:9")  # no server: it waits
    job_id = await p.launch(one, "glt_i_000000000000_unused", how)
    assert job_id.isdigit()
    census = await p.instances()
    [mine] = [r for r in census.reported if r.external_id == job_id]
    assert mine.instance_id == "0123456789ab" and mine.state in ("booting", "running")
    await p.terminate("0123456789ab", job_id)
    await p.terminate("0123456789ab", job_id)  # idempotent

    async def ended() -> bool:  # slurmctld shows a scancel a moment later under load
        gone = next(r for r in (await p.instances()).reported if r.external_id == job_id)
        return gone.state == "ended" and "CANCELLED" in gone.detail

    await until(ended, 30, what=f"Slurm job {job_id} ended CANCELLED")
    # Another control plane's batch jobs are not this one's.
    other = SlurmProvider(settings(gl_slurm), owner="t00004")
    assert all(r.external_id != job_id for r in (await other.instances()).reported)


async def test_another_cluster_s_job_is_never_cancelled_and_output_goes_where_told(
    gl_slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 32, items 3 and 7: ``scancel`` names this cluster's job name beside the job id, so
    a server given another cluster's job id (a restored copy of its database) cancels nothing;
    and the batch job's output goes to ``output`` (it was /tmp, hard-coded)."""
    ours = settings(gl_slurm)
    ours = ours.model_copy(update={"output": str(tmp_path / "out-%j.log")})
    p = SlurmProvider(ours, owner="t00005")
    [one, _two] = await p.offers()
    how = LaunchSpec("0123456789ab", "slurm-test", "http://127.0.0.1:9")
    job_id = await p.launch(one, "glt_i_000000000000_unused", how)
    copy = SlurmProvider(settings(gl_slurm), owner="t00006")  # another cluster id
    await copy.terminate("0123456789ab", job_id)
    await copy.terminate("ba9876543210", job_id)

    async def state() -> str:
        return next(r for r in (await p.instances()).reported if r.external_id == job_id).state

    await until(lambda: _is("running", state), 30, what="the job to run")
    assert await state() == "running"  # still: neither call touched it
    await until(lambda: (tmp_path / f"out-{job_id}.log").exists(), 30, what="its output file")
    await p.terminate("0123456789ab", job_id)
    await until(lambda: _is("ended", state), 30, what="our own cancel")


async def _is(want: str, state: Callable[[], Awaitable[str]]) -> bool:
    return await state() == want


@pytest.fixture
def served(tmp_path: Path, gl_slurm: SlurmCluster) -> Iterator[ServeProcess]:
    with serving(tmp_path, gl_slurm.provider_toml()) as server:
        yield server


def test_a_two_gpu_job_with_no_worker_starts_a_slurm_worker_runs_and_the_worker_ends(
    served: ServeProcess, tmp_path: Path, gl_slurm: SlurmCluster
) -> None:
    env = run_two_gpu_job(served, tmp_path)
    with served.client() as c:
        [job] = c.list()
        [attempt] = job.history
        assert attempt.provider == "slurm" and attempt.estimate > 0
        assert attempt.charge is not None and attempt.workers[0].startswith("slurm-")
        # Idle for idle_timeout (2 s): the batch job is cancelled, the worker gone.
        wait_until(
            lambda: c.instances(ended=True).instances[0].state == InstanceState.TERMINATED,
            60,
            what="the idle Slurm worker to be ended",
        )
        [inst] = c.instances(ended=True).instances
        assert inst.external_id and inst.offer.id == "slurm/gpu-2gpu"
        wait_until(lambda: c.workers() == [], 30, what="its worker to leave")
    queue = gl_slurm.run("squeue", "-h", "-t", "RUNNING,PENDING", "-n", "gpulayer-*")
    assert inst.external_id not in queue.stdout
    costs = subprocess.run(
        [*GL, "costs", "--by", "job"], env=env, capture_output=True, text=True, timeout=60
    )
    assert costs.returncode == 0, costs.stderr
    assert job.id in costs.stdout and "ESTIMATE" in costs.stdout and "CHARGE" in costs.stdout
    listed = subprocess.run([*GL, "providers"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "slurm/gpu-2gpu: 2× a100 80 GiB" in listed.stdout and "$4.20/h" in listed.stdout


def test_slurm_cancelling_the_worker_s_batch_job_loses_its_job_and_fails_the_instance(
    served: ServeProcess, gl_slurm: SlurmCluster
) -> None:
    with served.client() as c:
        spec = JobSpec(
            workload=CommandWorkload(argv=["sleep", "300"]),
            resources=Resources(gpus=1),
            retries=1,
            retry_backoff=0,
        )
        job = c.submit(spec)
        wait_until(lambda: c.get(job.id).state == JobState.RUNNING, 60, what="the job to run")
        [inst] = c.instances().instances
        assert inst.external_id is not None
        r = gl_slurm.run("scancel", inst.external_id)
        assert r.returncode == 0, r.stderr
        # Its worker is told to stop (SIGTERM) and leaves: the job goes round again.
        wait_until(lambda: c.get(job.id).attempts == 1, 60, what="the job to be retried")
        first = c.get(job.id).history[0]
        assert first.outcome == "lost" and first.retried
        wait_until(
            lambda: c.instances(ended=True).instances[-1].state.ended,
            60,
            what="the cancelled instance to be failed",
        )
        ended = next(i for i in c.instances(ended=True).instances if i.id == inst.id)
        assert ended.state == InstanceState.FAILED
        assert "CANCELLED" in (ended.reason or "") or "worker was lost or left" in (
            ended.reason or ""
        )
        c.cancel(job.id)
