"""A folder's files as they are now (path -> size, times, mode, sha256), read through the index.

``survey`` looks at every file (a full scan: the first sync, or after the detector lost track);
``look`` at the few paths the detector named. Both hash only files whose stat moved since the
index saw them, and both return what a delta needs: the files as they are, and the notes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..contracts.workspace import FileEntry
from .index import Changing, Index, Known, Unreadable, known_of, read_stable
from .names import wire
from .scan import Caps, Notes, Rules, scan


def _read(broot: bytes, rel: bytes, index: Index, notes: Notes) -> Known | None:
    path = os.path.join(broot, rel)
    try:
        st = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    k = index.known(rel, st)
    if k is not None:
        return k
    try:
        data, st = read_stable(path)
    except FileNotFoundError:
        return None
    except (Changing, Unreadable) as exc:
        notes.add(str(exc))
        return None
    k = known_of(data, st)
    index.files[rel] = k
    return k


def survey(root: Path, caps: Caps, rules: Rules, index: Index) -> tuple[dict[bytes, Known], Notes]:
    """Every file of the workspace (WorkspaceTooBig past a cap)."""
    found, notes = scan(root, caps, rules)
    broot = os.fsencode(root)
    files: dict[bytes, Known] = {}
    for f in found:
        k = _read(broot, f.rel, index, notes)
        if k is not None:
            files[f.rel] = k
    for gone in set(index.files) - set(files):
        del index.files[gone]
    return files, notes


def look(
    root: Path, paths: set[bytes], rules: Rules, index: Index
) -> tuple[dict[bytes, Known | None], Notes]:
    """The named paths as they are now: a file's Known, or None (gone, ignored, not a file)."""
    broot = os.fsencode(root)
    notes = Notes()
    out: dict[bytes, Known | None] = {}
    for rel in paths:
        if rules.ignored(rel, False) or any(rules.ignored(rel[:i], True) for i in _dir_ends(rel)):
            out[rel] = None
            continue
        if os.path.islink(os.path.join(broot, rel)):
            out[rel] = None
            continue
        out[rel] = _read(broot, rel, index, notes)
        if out[rel] is None:
            index.files.pop(rel, None)
    return out, notes


def _dir_ends(rel: bytes) -> list[int]:
    return [i for i in range(len(rel)) if rel[i : i + 1] == b"/"]


def entry(rel: bytes, k: Known) -> FileEntry:
    path, raw = wire(rel)
    return FileEntry.model_construct(path=path, raw=raw, size=k.size, mode=k.mode, digest=k.digest)
