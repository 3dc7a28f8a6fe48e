"""One-shot cells' workspaces given bad inputs: each a clear error, nothing lost.

A manifest of another user's (a digest alone grants nothing), a manifest naming a file outside
the folder, a folder too big, a worker whose disk fills mid-copy, a worker that copies folders
joining after the notebook looked, odd file names, and write-back names from a worker that try
to leave the folder."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel import bundles
from gpulayer_kernel.client.admin import AdminCalls
from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.client.workspace import CpWorkspaceLink
from gpulayer_kernel.contracts import Artifact, Job, JobSpec, JobState, PythonWorkload
from gpulayer_kernel.contracts.workspace import (
    FileEntry,
    WorkspaceAnswer,
    WorkspaceManifest,
    WorkspaceSource,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.security.roles import resolved
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until
from gpulayer_kernel.workspace import pack as packs
from gpulayer_kernel.workspace.cellsync import CellFolder, bring_back

from .conftest import notebook_folder
from .test_cell_workspace import close, kernel_in, own, plain, served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def put_pack(server: ServeProcess, token: str, objects: list[tuple[str, bytes]]) -> None:
    done = httpx.post(
        f"{server.url}/api/v1/workspace/objects",
        content=packs.pack(objects),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert done.status_code == 204, done.text


def entry_of(path: str, data: bytes) -> FileEntry:
    return FileEntry(path=path, size=len(data), digest=hashlib.sha256(data).hexdigest())


def manifest_of(*entries: FileEntry) -> tuple[str, bytes]:
    body = WorkspaceManifest(files=list(entries)).model_dump_json().encode()
    return hashlib.sha256(body).hexdigest(), body


def cell_job(client: object, folder: Path, manifest: str) -> Job:
    digest, data = bundles.build({"cell.py": b"import os\nsorted(os.listdir('.'))\n"})
    client.put_bundle(data, digest)  # type: ignore[attr-defined]
    source = WorkspaceSource(folder=str(folder), host="the-notebooks-machine", manifest=manifest)
    spec = JobSpec(
        name="cell",
        workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py", workspace=source),
    )
    job = client.submit(spec)  # type: ignore[attr-defined]
    return client.wait(job.id, 60)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def far(tmp_path: Path) -> Iterator[tuple[ServeProcess, WorkerProcess]]:
    server, worker = served(tmp_path, "--host-id", "another-machine")
    try:
        yield server, worker
    finally:
        worker.stop()
        server.stop()


def test_a_manifest_of_another_users_files_gives_nothing(
    far: tuple[ServeProcess, WorkerProcess], tmp_path: Path
) -> None:
    server, worker = far
    secret = b"admin's private data\n"
    digest, body = manifest_of(entry_of("private.csv", secret))
    put_pack(server, server.admin_token, [(hashlib.sha256(secret).hexdigest(), secret)])
    put_pack(server, server.admin_token, [(digest, body)])
    with server.client() as admin:
        admin._run(AdminCalls().add_user("mallory", "user"))
        _, token = admin.create_token("client", user="mallory")

    with Client(server.url, token) as mallory:
        job = cell_job(mallory, tmp_path / "theirs", digest)  # the digest, not the bytes
    assert job.state == JobState.FAILED
    assert "not in the control plane's store for the job's owner" in (job.reason or "")
    copies = worker.home / "work" / "workspaces"
    assert not any(p.name == "private.csv" for p in copies.rglob("*"))


def test_a_manifest_naming_a_file_outside_the_folder_is_refused(
    far: tuple[ServeProcess, WorkerProcess], tmp_path: Path
) -> None:
    server, worker = far
    data = b"planted\n"
    digest, body = manifest_of(entry_of("../../escaped.txt", data), entry_of("ok.txt", data))
    put_pack(server, server.admin_token, [(hashlib.sha256(data).hexdigest(), data), (digest, body)])
    with server.client() as c:
        job = cell_job(c, tmp_path / "proj", digest)
    assert job.state == JobState.FAILED
    assert "is not a relative path inside the folder" in (job.reason or ""), job.reason
    # Nowhere, inside or out. os.walk, not rglob: the worker may be removing the job's folder
    # as this looks (rglob raised FileNotFoundError for a folder gone mid-walk in a CI run).
    assert not [d for d, _, files in os.walk(worker.home) if "escaped.txt" in files]


def test_a_folder_too_big_runs_the_cell_without_it_and_says_so(
    far: tuple[ServeProcess, WorkerProcess], tmp_path: Path
) -> None:
    server, _ = far
    folder = notebook_folder(tmp_path)
    with open(folder / "weights.bin", "wb") as f:
        f.truncate(10 << 30)  # sparse: 10 GiB to the scan, nothing on the disk
    k = kernel_in(folder, tmp_path, server)
    try:
        cell = k.run("%%gpulayer\nimport os\nprint(os.path.exists('data.csv'), 6 * 7)", timeout=120)
        assert cell.ok, plain(cell.stream())
        assert own(cell.stream("stdout")).split() == ["False", "42"]  # it ran, without it
        said = plain(cell.stream("stderr"))
        assert "the workspace was not synced" in said and "weights.bin (10 GiB)" in said
        assert ".gpulayerignore" in said
        assert os.path.getsize(folder / "weights.bin") == 10 << 30  # nothing lost
        (folder / ".gpulayerignore").write_text("*.bin\n")  # the hint's way: the next cell has it
        cell = k.run("%%gpulayer\nimport os\nprint(os.path.exists('data.csv'))", timeout=120)
        assert own(cell.stream("stdout")).split() == ["True"], plain(cell.stream())
    finally:
        close(k)


def test_odd_file_names_reach_the_worker_exactly(
    far: tuple[ServeProcess, WorkerProcess], tmp_path: Path
) -> None:
    server, _ = far
    folder = tmp_path / "odd"
    folder.mkdir()
    names = [b"new\nline.txt", b"caf\xe9.csv", b"Data.csv", b"data.csv"]
    for n in names:
        with open(os.path.join(os.fsencode(folder), n), "wb") as f:
            f.write(n * 3)
    k = kernel_in(folder, tmp_path, server)
    try:
        cell = k.run(
            "%%gpulayer\nimport os, hashlib\n"
            "for n in sorted(os.listdir(b'.')):\n"
            "    print(n.hex(), hashlib.sha256(open(n, 'rb').read()).hexdigest())",
            timeout=120,
        )
        assert cell.ok, plain(cell.stream())
        got = dict(line.split() for line in own(cell.stream("stdout")).strip().splitlines())
        assert got == {n.hex(): hashlib.sha256(n * 3).hexdigest() for n in names}
    finally:
        close(k)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs for the far worker's work folder (root only)."""
    where = tmp_path / "worker" / "work"
    where.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def half_copied(root: Path) -> list[str]:
    """The worker's temporary files under ``root`` (a walk that takes folders vanishing)."""
    return [n for _, _, files in os.walk(root) for n in files if n.startswith(".gpulayer-tmp-")]


def test_the_worker_disk_filling_mid_copy_fails_the_cell_saying_so_and_loses_nothing(
    tiny_disk: Path, tmp_path: Path
) -> None:
    server, worker = served(tmp_path, "--host-id", "another-machine")
    folder = notebook_folder(tmp_path)
    big = os.urandom(5 << 20)
    (folder / "weights.npy").write_bytes(big)
    k = kernel_in(folder, tmp_path, server)
    try:
        cell = k.run("%%gpulayer\nprint(6 * 7)", timeout=120)
        assert not cell.ok
        said = plain(cell.stream()) + str(cell.error)
        assert "is full" in said and "weights.npy" in said, said
        assert (folder / "weights.npy").read_bytes() == big  # nothing lost here
        # The worker may still be removing the job's folder as the cell's failure arrives (a
        # walk of it met a folder gone mid-walk): its half-copied files go with it.
        wait_until(lambda: not half_copied(tiny_disk), 20, what="no half-copied file left")
        (folder / ".gpulayerignore").write_text("*.npy\n")  # leave it out: the next cell runs
        cell = k.run("%%gpulayer\nprint(open('data.csv').read().count(','))", timeout=120)
        assert cell.ok and own(cell.stream("stdout")).split() == ["3"], plain(cell.stream())
    finally:
        close(k)
        worker.stop()
        server.stop()


def test_a_worker_that_copies_folders_joining_later_gets_the_folder_from_the_next_cell(
    tmp_path: Path,
) -> None:
    server, near = served(tmp_path)  # on this machine: in place, so no manifest is made
    folder = notebook_folder(tmp_path)
    k = kernel_in(folder, tmp_path, server)
    far: WorkerProcess | None = None
    try:
        cell = k.run("%%gpulayer\nimport os\nos.getcwd()", timeout=120)
        assert cell.ok and cell.result_text() == repr(str(folder)), plain(cell.stream())
        near.stop()
        far = WorkerProcess(
            server.url,
            server.create_token("join"),
            name="far",
            simulate_gpus=1,
            home=tmp_path / "far",
            args=("--host-id", "another-machine"),
        ).start()
        # The notebook looked at the fleet a moment ago: this cell sends no copy, and says so.
        cell = k.run("%%gpulayer --worker far\nimport os\nos.path.exists('data.csv')", timeout=120)
        assert cell.ok and cell.result_text() == "False", plain(cell.stream())
        assert "the cell sent no copy of the folder" in plain(cell.stream())
        cell = k.run("%%gpulayer --worker far\nimport os\nos.path.exists('data.csv')", timeout=120)
        assert cell.ok and cell.result_text() == "True", plain(cell.stream())
    finally:
        close(k)
        if far is not None:
            far.stop()
        near.stop()
        server.stop()


async def test_write_back_names_from_a_worker_never_leave_the_folder(
    gl_cp: ControlPlane, tmp_path: Path
) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    data = b"not yours\n"
    digest = hashlib.sha256(data).hexdigest()
    await gl_cp.workspace.put_pack(packs.pack([(digest, data)]), resolved(None).user)
    outputs = [
        FileEntry(path=p, size=len(data), digest=digest)
        for p in ("../escaped.txt", "/etc/evil", "fine.txt")
    ]
    record = WorkspaceAnswer(id="job-x", outputs=outputs).model_dump_json().encode()
    rdigest = await gl_cp.put_blob(record)
    job = Job(id="x", seq=1, spec=_spec(), submitted_at=0.0)
    keeper = CellFolder(folder, CpWorkspaceLink(gl_cp))
    try:
        words, _ = await bring_back(
            gl_cp,
            job,
            [Artifact(digest=rdigest, size=len(record), name=".gpulayer/workspace-n0.json")],
            keeper,
            {},
            None,
        )
    finally:
        keeper.close()
    refused = [w for w in words if w.startswith("refused a file name from the worker")]
    assert len(refused) == 2, words
    assert (folder / "fine.txt").read_bytes() == data
    assert not (tmp_path / "escaped.txt").exists()


def _spec() -> JobSpec:
    digest = "0" * 64
    return JobSpec(workload=PythonWorkload(bundle=digest, entrypoint="cell:cell.py"))
