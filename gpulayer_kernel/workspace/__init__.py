"""The workspace (ADR 0022): the notebook's folder where its code runs, for kernels and sessions.

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
- ``service.py`` — the control plane's part: the decision per session, each user's objects, the
  lane of calls between the two ends.
"""

from __future__ import annotations

from .host import HostWorkspace
from .plan import decide, host_id
from .scan import IGNORE_FILE, Caps, WorkspaceTooBig

__all__ = ["IGNORE_FILE", "Caps", "HostWorkspace", "WorkspaceTooBig", "decide", "host_id"]
