"""Where a session's code runs: the control plane's decision, a pure function of what it knows.

In place when the worker sees the notebook's folder: a path it declared shared contains it (the
mapping turns the Jupyter host's path into the worker's), or the worker runs on the Jupyter
host itself (same host id, or the embedded worker in the control plane's own process). Synced
when it does not but takes synced workspaces. None otherwise, with the reason in words.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from functools import cache

from ..contracts.workspace import PathMap, WorkerShares, WorkspacePlan, WorkspaceSource

HOST_ID_ENV = "GPULAYER_HOST_ID"
BACK_ENV = "GPULAYER_WORKSPACE_BACK_BYTES"  # an output over this stays on the worker (pull it)


@cache
def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        except OSError:
            continue
    return f"node-{uuid.getnode():012x}"


def host_id() -> str:
    """This machine's id: ``$GPULAYER_HOST_ID`` (a worker in a private mount namespace, or a
    test's pretend remote machine), else ``/etc/machine-id``."""
    return os.environ.get(HOST_ID_ENV) or _machine_id()


def decide(
    source: WorkspaceSource,
    shares: WorkerShares | None,
    *,
    worker: str,
    in_process: bool = False,
) -> WorkspacePlan:
    """The plan for ``source`` on a worker named ``worker`` that declared ``shares``."""
    folder = posixpath.normpath(source.folder)
    if shares is not None:
        mapped = _mapped(folder, shares.shared)
        if mapped is not None:
            return WorkspacePlan(
                mode="in_place",
                path=mapped,
                reason=f"worker {worker} shares {folder} (as {mapped})",
            )
    same = (shares is not None and shares.host == source.host) or (shares is None and in_process)
    if same:
        return WorkspacePlan(
            mode="in_place", path=folder, reason=f"worker {worker} runs on the Jupyter host"
        )
    if shares is None:
        return WorkspacePlan(
            mode="none",
            reason=f"worker {worker} is from before workspaces: the code runs in a scratch "
            "folder there",
        )
    if not shares.synced:
        return WorkspacePlan(
            mode="none",
            reason=f"worker {worker} does not see {folder} and takes no synced workspaces",
        )
    return WorkspacePlan(
        mode="synced", reason=f"worker {worker} does not see {folder}: a synced copy"
    )


def _mapped(folder: str, shared: list[PathMap]) -> str | None:
    """``folder`` through the longest declared share that contains it, or None."""
    best: tuple[int, str] | None = None
    for m in shared:
        here = posixpath.normpath(m.here)
        if folder == here or folder.startswith(here.rstrip("/") + "/"):
            rest = folder[len(here) :].lstrip("/")
            there = posixpath.normpath(m.there)
            path = posixpath.join(there, rest) if rest else there
            if best is None or len(here) > best[0]:
                best = (len(here), path)
    return best[1] if best else None


def parse_share(text: str) -> PathMap:
    """``--shared-path /home/alice=/mnt/home/alice`` (or one path: the same on both sides)."""
    from ..errors import InvalidInput

    here, sep, there = text.partition("=")
    here, there = here.strip(), (there.strip() if sep else here.strip())
    if not here.startswith("/") or not there.startswith("/"):
        raise InvalidInput(
            f"--shared-path {text!r} is not an absolute path (or HERE=THERE of two)",
            hint="e.g. --shared-path /home/alice=/mnt/home/alice: /home/alice on the Jupyter "
            "host is /mnt/home/alice on this worker",
            details={"field": "--shared-path", "value": text},
            code="bad_shared_path",
        )
    return PathMap(here=here, there=there)
