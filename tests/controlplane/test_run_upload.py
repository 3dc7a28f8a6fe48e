"""A run that carries its bundle (protocol 1.1: the notebook's and the clients' one-shot path).

The uploader's claim on the bundle and the job's row are written in one transaction, not two
(the claim rides the job's own commit), and a small bundle stored already is not written again.
Over the real SQLite and file stores, with fakes that record what they were asked (no mock).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import JobSpec, PythonWorkload
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.errors import BundleError, StoreError, Unavailable
from gpulayer_kernel.security.roles import resolved
from gpulayer_kernel.store import LocalArtifactStore
from gpulayer_kernel.store.group import Run

from .stores import AwayStore


class RecordingStore(AwayStore):
    """Remembers the tables each committed transaction wrote."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.groups: list[set[str]] = []

    async def _commit(self, queue: Sequence[Run]) -> None:
        await super()._commit(queue)
        self.groups.append({run.table for run in queue})


class CountingFiles(LocalArtifactStore):
    """Counts the blobs it was asked to write."""

    puts = 0

    def put(self, data: bytes, digest: str | None = None) -> str:
        self.puts += 1
        return super().put(data, digest)


@pytest.fixture
async def plane(
    tmp_path: Path,
) -> AsyncIterator[tuple[ControlPlane, RecordingStore, CountingFiles]]:
    store = RecordingStore(tmp_path / "cp.db")
    await store.open()
    files = CountingFiles(tmp_path / "blobs")
    cp = ControlPlane(store, files)
    await cp.start()
    try:
        yield cp, store, files
    finally:
        await cp.close()
        await store.close()


def cell(source: bytes = b"1 + 1\n") -> tuple[JobSpec, bytes, str]:
    digest, bundle = bundles.build({"cell.py": source})
    spec = JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py"))
    return spec, bundle, digest


async def test_the_bundles_claim_commits_with_the_jobs_row(
    plane: tuple[ControlPlane, RecordingStore, CountingFiles],
) -> None:
    cp, store, _ = plane
    spec, bundle, digest = cell()
    followed = await cp.run(spec, bundle)
    assert {"blob_owners", "jobs"} <= next(g for g in store.groups if "blob_owners" in g)
    assert await store.blob_owned(digest, resolved(None).user)
    assert (await cp.get(followed.job.id)).spec.workload == spec.workload


async def test_a_run_the_store_refuses_leaves_neither_its_job_nor_its_claim(
    plane: tuple[ControlPlane, RecordingStore, CountingFiles],
) -> None:
    cp, store, _ = plane
    spec, bundle, digest = cell(b"2 + 2\n")
    store.down = True
    with pytest.raises((Unavailable, StoreError)):
        await cp.run(spec, bundle)
    store.down = False
    assert not await store.blob_owned(digest, resolved(None).user)
    assert await cp.list() == []
    followed = await cp.run(spec, bundle)  # the same run again, once the store answers
    assert await store.blob_owned(digest, resolved(None).user)
    assert [j.id for j in await cp.list()] == [followed.job.id]


async def test_a_small_bundle_stored_already_is_not_written_again(
    plane: tuple[ControlPlane, RecordingStore, CountingFiles], tmp_path: Path
) -> None:
    cp, _, files = plane
    spec, bundle, digest = cell(b"3 + 3\n")
    await cp.run(spec, bundle)
    await cp.run(spec, bundle)
    assert files.puts == 1
    (tmp_path / "blobs" / digest[:2] / digest).unlink()  # gone meanwhile: written again
    await cp.run(spec, bundle)
    assert files.puts == 2 and files.has(digest)
    with pytest.raises(BundleError, match="it was sent as"):  # not what it says it is
        await cp.put_blob(b"something else", digest)
