"""The workspace (ADR 0022): the notebook's folder where its code runs, for kernels, sessions and
one-shot cells.

One package that the Jupyter host, the worker and the control plane share:

- ``plan.py`` — the decision (pure): in place when the worker sees the folder, synced otherwise;
- ``scan.py`` — ignore rules (``.gpulayerignore``, defaults), caps, notes on what is left out;
- ``index.py`` — the mtime index and reading a file at one moment (sha256);
- ``tree.py`` — a folder's files as they are now, through the index;
- ``watch.py`` — the change detector (inotify; a cell with no change costs microseconds);
- ``names.py`` — names on the wire, refused names, writing inside the folder only;
- ``pack.py`` — many files in one zstd pack, each verified by its digest;
- ``host.py`` — the Jupyter host's end: send the folder, then changes, take outputs back;
- ``remote.py`` — the worker's end: the folder the ranks run in, the calls it answers;
- ``service.py`` — the control plane's part: the decision per session and node, each user's
  objects, the lanes of calls between the two ends (one per node);
- ``cells.py`` / ``cellsync.py`` — a one-shot cell's end on the Jupyter host: the folder named on
  the job (the fast path), its manifest when a worker must copy it, the outputs written back;
- ``jobs.py`` — a one-shot job's end on the worker: in place, or its copy of the folder;
- ``pulls.py`` — files too big to come back on their own (``%gpulayer pull``).

Its names load when first used: the ``%%gpulayer`` magic imports ``cells.py`` with the extension,
and must not pay for zstd, pathspec and inotify until a folder is sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .host import HostWorkspace
    from .plan import decide, host_id
    from .scan import IGNORE_FILE, Caps, WorkspaceTooBig

__all__ = ["IGNORE_FILE", "Caps", "HostWorkspace", "WorkspaceTooBig", "decide", "host_id"]

_WHERE = {
    "HostWorkspace": "host",
    "decide": "plan",
    "host_id": "plan",
    "IGNORE_FILE": "scan",
    "Caps": "scan",
    "WorkspaceTooBig": "scan",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())
