"""Workspace contracts (ADR 0022): the notebook's folder where its code runs.

A kernel or session may name its notebook's folder (:class:`WorkspaceSource`: the folder and
the Jupyter host's id). A worker declares what it sees (:class:`WorkerShares`: its host id and
shared paths with their mapping). The control plane decides, for the worker a session was placed
on, a :class:`WorkspacePlan`: *in place* (the worker sees the folder: run there, copy nothing),
*synced* (copy it over, content-addressed, and write outputs back) or *none* (why not).

A synced workspace moves as deltas of a manifest (:class:`WorkspaceDelta` of :class:`FileEntry`:
path, size, mode, sha256), versioned so that either side can ask for the whole again, and as
packs of file contents (zstd frames, ``workspace/pack.py``) through the control plane's store,
where each user's files are claimed for that user alone (a digest grants nothing by itself).
The Jupyter host's calls (:class:`WorkspaceCall`) reach the session's worker through a lane the
worker long-polls; its :class:`WorkspaceAnswer` comes back the same way.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._base import SHA256_PATTERN, Contract

MAX_ENTRIES = 200_000  # files one delta may name (the scan's own cap is lower)
MAX_PATH = 4096
MAX_NOTES = 200

WorkspaceMode = Literal["in_place", "synced", "none"]
# A one-shot job's outputs in its notebook's folder: the record of each node's, an artifact.
RECORD = ".gpulayer/workspace-n{node}.json"
RECORD_PREFIX = ".gpulayer/workspace-n"


class WorkspaceSource(Contract):
    """Where a kernel's, session's or one-shot job's notebook is: a folder on the Jupyter host.

    A one-shot job (``%%gpulayer``) carries it on its workload, with ``manifest`` when a worker
    that does not see the folder may take it: the digest of a :class:`WorkspaceManifest` in the
    control plane's store (the folder's files, each there too, for the job's owner)."""

    folder: str = Field(min_length=1, max_length=MAX_PATH, description="absolute path there")
    host: str = Field(
        min_length=1,
        max_length=200,
        description="the Jupyter host's id (its machine id): a worker with the same id sees "
        "the same disk",
    )
    manifest: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="a one-shot job's copy of the folder: the digest of its manifest in the "
        "store (left out when none: a worker that does not see the folder runs it without)",
        exclude_if=lambda v: v is None,
    )
    pull: list[Annotated[str, Field(min_length=1, max_length=MAX_PATH)]] = Field(
        default_factory=list,
        max_length=1_000,
        description="files of the worker's copy to send back whatever their size "
        "(`%gpulayer pull` after a one-shot cell); left out when none",
        exclude_if=lambda v: not v,
    )
    cap: int | None = Field(
        None,
        ge=0,
        description="a one-shot job's outputs: bytes one file may have to come back unasked "
        "(bigger ones stay on the worker, listed); left out: the default",
        exclude_if=lambda v: v is None,
    )


class PathMap(Contract):
    """A folder the worker shares with Jupyter hosts: ``here`` on theirs is ``there`` on it."""

    here: str = Field(min_length=1, max_length=MAX_PATH)
    there: str = Field(min_length=1, max_length=MAX_PATH)


class WorkerShares(Contract):
    """What a worker sees of the Jupyter hosts' disks (sent when it joins)."""

    host: str = Field(min_length=1, max_length=200, description="this machine's id")
    shared: list[PathMap] = Field(default_factory=list, max_length=64)
    synced: bool = Field(True, description="whether it takes synced workspaces")


class WorkspacePlan(Contract):
    """How a session's workspace is made on its worker (decided by the control plane)."""

    mode: WorkspaceMode
    path: str | None = Field(None, description="in place: the folder as the worker sees it")
    reason: str = Field("", max_length=2_000, description="why this mode (or why none)")


class FileEntry(Contract):
    """One file of a workspace: its path (relative, '/'-separated), size, mode and sha256."""

    path: str = Field(min_length=1, max_length=MAX_PATH, description="UTF-8, or an escape")
    raw: str | None = Field(
        None, max_length=2 * MAX_PATH, description="the name's bytes, base64, when not UTF-8"
    )
    size: int = Field(ge=0)
    mode: int = Field(0o644, ge=0, le=0o7777)
    digest: str = Field(pattern=SHA256_PATTERN)


class WorkspaceManifest(Contract):
    """A folder's files at one moment, for a one-shot job's worker to copy (sorted by name)."""

    files: list[FileEntry] = Field(default_factory=list, max_length=MAX_ENTRIES)


class WorkspaceDelta(Contract):
    """What changed since ``base`` (None: the whole workspace, replacing what the worker has)."""

    base: int | None = Field(None, ge=0)
    version: int = Field(ge=1)
    put: list[FileEntry] = Field(default_factory=list, max_length=MAX_ENTRIES)
    remove: list[FileEntry] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        description="files gone on the Jupyter host (their last synced digest)",
    )


class CollectAsk(Contract):
    """Which files the worker should send back: changed ones under ``cap`` bytes, or ``paths``."""

    cap: int = Field(64 << 20, ge=0, description="bytes one file may have to come back unasked")
    total: int = Field(256 << 20, ge=0, description="bytes all files may have, per collect")
    paths: list[str] = Field(default_factory=list, max_length=1_000, description="pull these")


class WorkspaceCall(Contract):
    """A Jupyter host's call on its session's worker: sync a delta, or collect outputs."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="chosen by the caller")
    op: Literal["sync", "collect"]
    delta: WorkspaceDelta | None = None
    collect: CollectAsk | None = None


class WorkspaceAnswer(Contract):
    """The worker's answer to one call."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    ok: bool = True
    version: int = Field(0, ge=0, description="the manifest version the worker holds now")
    need_full: bool = Field(False, description="the delta's base is not what it holds")
    outputs: list[FileEntry] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="sent back (in the store)"
    )
    big: list[FileEntry] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="changed, left there (pull)"
    )
    notes: list[str] = Field(default_factory=list, max_length=MAX_NOTES)
    error: str | None = Field(None, max_length=4_000)
    code: str | None = Field(None, max_length=100)


class WorkspaceCalls(Contract):
    """A worker's long-poll answer: the calls it has not answered yet."""

    calls: list[WorkspaceCall] = Field(default_factory=list)


class Digests(Contract):
    """Digests asked about, or answered (which are missing)."""

    digests: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES)


class WorkspaceView(Contract):
    """A session's workspace as the sidebar and ``gpulayer sessions`` show it."""

    mode: WorkspaceMode
    folder: str | None = Field(None, description="the notebook's folder on the Jupyter host")
    path: str | None = Field(None, description="where the code runs on the worker")
    reason: str = ""
    version: int = Field(0, ge=0, description="syncs applied (synced)")
    files: int = Field(0, ge=0)
    bytes: int = Field(0, ge=0)
