"""The worker's bundle cache: bounded on disk, LRU, never evicting a bundle a running job holds."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import JobSpec, JobState, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import BundleError
from gpulayer_kernel.worker.bundlecache import BundleCache, tree_bytes

from ..conftest import WorkerFactory

MB = 1 << 20


def _bundle(i: int, size: int = 20 * MB) -> tuple[str, bytes]:
    return bundles.build({"job.py": b"print('ok')\n", "data.bin": bytes([i]) * size})


@pytest.mark.slow  # ~4 s with two xdist workers on two cores
async def test_six_20mb_bundles_under_a_50mb_cap_leave_at_most_50mb(
    gl_cp: ControlPlane, gl_worker: WorkerFactory, tmp_path: Path
) -> None:
    await gl_worker(bundle_cache_bytes=50 * MB)
    for i in range(6):
        digest, data = _bundle(i)
        await gl_cp.put_bundle(data, digest)
        job = await gl_cp.submit(
            JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="job.py"))
        )
        assert (await gl_cp.wait(job.id, timeout=60)).state == JobState.SUCCEEDED
    cached = tmp_path / "work-w1" / "bundles"
    assert 20 * MB <= tree_bytes(cached) <= 50 * MB
    assert len(list(cached.iterdir())) == 2  # the two most recent


async def test_a_bundle_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = BundleCache(tmp_path / "bundles", max_bytes=50 * MB)
    made = [_bundle(i) for i in range(4)]

    def fetcher(data: bytes):  # type: ignore[no-untyped-def]
        async def fetch() -> bytes:
            return data

        return fetch

    held_digest, held_data = made[0]
    held = await cache.acquire(held_digest, fetcher(held_data))
    for digest, data in made[1:]:
        await cache.acquire(digest, fetcher(data))
        cache.release(digest)
        assert held.is_dir() and (held / "data.bin").stat().st_size == 20 * MB
    assert cache.size <= 50 * MB
    # Least recently used goes first once nobody holds it; a re-used one moves to the back.
    cache.release(held_digest)
    await cache.acquire(made[3][0], fetcher(made[3][1]))  # used after the held one
    cache.release(made[3][0])
    await cache.acquire(made[2][0], fetcher(made[2][1]))  # over the cap again
    cache.release(made[2][0])
    assert not held.exists() and (tmp_path / "bundles" / made[3][0]).is_dir()
    # A new cache on the same directory adopts what is there.
    again = BundleCache(tmp_path / "bundles", max_bytes=50 * MB)
    path = await again.acquire(made[3][0], fetcher(b"not fetched again"))
    assert path.is_dir() and again.size == cache.size


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (gzip.compress(_bundle(1, 10)[1]), "gzip-compressed"),
        (b"", "empty"),
        (b"not a tar at all" * 100, "not a tar archive"),
    ],
)
async def test_a_fetched_bundle_that_is_not_one_fails_its_job_by_name(
    gl_cp: ControlPlane,
    gl_worker: WorkerFactory,
    data: bytes,
    says: str,
) -> None:
    await gl_worker()
    # Stored as a plain blob (as an artifact would be), so the control plane serves it as is.
    digest = await gl_cp.put_blob(data)
    job = await gl_cp.submit(JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="job.py")))
    done = await gl_cp.wait(job.id, timeout=30)
    assert done.state == JobState.FAILED and done.reason is not None
    assert done.reason.startswith("bundle_invalid: ") and says in done.reason, done.reason
    assert "worker error" not in done.reason


async def test_the_size_limit_is_enforced_before_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundles, "MAX_BUNDLE_BYTES", 1000)
    digest, data = _bundle(1, 5000)

    async def fetch() -> bytes:
        return data

    with pytest.raises(BundleError, match="the limit is 1000") as err:
        await BundleCache(tmp_path / "b").acquire(digest, fetch)
    assert err.value.code == "bundle_invalid"
    assert not (tmp_path / "b" / digest).exists()
