"""Which files make a workspace: ignore rules, caps, and the notes on what was left out.

Rules are ``.gitignore``-style (``pathspec``): the defaults (``DEFAULT_IGNORE``: version control,
virtualenvs, caches, ``node_modules``), then the folder's own ``.gpulayerignore`` (a ``!`` line
takes a default back). ``.gitignore`` is not read: data files are often kept out of git, and the
notebook needs them. A folder holding ``pyvenv.cfg`` or ``conda-meta`` is an environment, skipped.

The walk counts as it goes and stops at the first file past a cap (``Caps``), so a notebook in a
home folder of 300,000 files is refused in the time it takes to see the cap's worth, naming the
entries that hold the most files or bytes and the ignore file that would exclude them. Symlinks
are never followed (one pointing out of the folder is named in a note); unreadable files, FIFOs,
sockets and devices are skipped with a note.
"""

from __future__ import annotations

import heapq
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from ..display import human_bytes
from ..errors import InvalidInput
from .names import TMP_PREFIX, shown

IGNORE_FILE = ".gpulayerignore"
DEFAULT_IGNORE = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    ".ipynb_checkpoints/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
    ".nox/",
    "node_modules/",
    ".cache/",
    ".DS_Store",
    ".gpulayer/",
    f"{TMP_PREFIX}*",
)
MAX_NOTES = 20  # notes kept word for word; the rest are counted


@dataclass(frozen=True)
class Caps:
    """How big a workspace may be (files, bytes); past either, it is refused."""

    files: int = 50_000
    bytes: int = 2 << 30

    @classmethod
    def from_env(cls) -> Caps:
        d = cls()
        return cls(
            files=int(os.environ.get("GPULAYER_WORKSPACE_MAX_FILES", d.files)),
            bytes=int(os.environ.get("GPULAYER_WORKSPACE_MAX_BYTES", d.bytes)),
        )


class WorkspaceTooBig(InvalidInput):
    """The folder is over a cap: the message names its biggest entries and how to leave them."""

    code = "workspace_too_big"
    status = 413


@dataclass(frozen=True)
class Found:
    """A regular file seen by the walk."""

    rel: bytes
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    mode: int


@dataclass
class Notes:
    """What was left out and why, in a few words each (bounded; the rest counted)."""

    lines: list[str] = field(default_factory=list)
    more: int = 0

    def add(self, text: str) -> None:
        if len(self.lines) < MAX_NOTES:
            self.lines.append(text)
        else:
            self.more += 1

    def all(self) -> list[str]:
        return self.lines + ([f"… and {self.more} more"] if self.more else [])


class Rules:
    """The ignore rules of one folder (the defaults, then its ``.gpulayerignore``)."""

    def __init__(self, root: Path) -> None:
        lines = list(DEFAULT_IGNORE)
        own = root / IGNORE_FILE
        try:
            lines += own.read_text(errors="replace").splitlines()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            pass
        self.spec = pathspec.GitIgnoreSpec.from_lines(lines)

    def ignored(self, rel: bytes, is_dir: bool) -> bool:
        text = os.fsdecode(rel)
        return self.spec.match_file(text + "/" if is_dir else text)


def scan(root: Path, caps: Caps, rules: Rules | None = None) -> tuple[list[Found], Notes]:
    """Every file of the workspace at ``root``, or WorkspaceTooBig as soon as a cap is passed."""
    rules = rules or Rules(root)
    broot = os.fsencode(root)
    found: list[Found] = []
    notes = Notes()
    total = 0
    per_top: Counter[bytes] = Counter()
    bytes_top: Counter[bytes] = Counter()
    biggest: list[tuple[int, bytes]] = []
    stack: list[bytes] = [b""]
    while stack:
        rel_dir = stack.pop()
        try:
            it = os.scandir(os.path.join(broot, rel_dir) if rel_dir else broot)
        except PermissionError:
            notes.add(f"{shown(rel_dir)}/: not readable, skipped")
            continue
        with it:
            for e in it:
                rel = rel_dir + b"/" + e.name if rel_dir else e.name
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                mode = st.st_mode
                if stat.S_ISDIR(mode):
                    if rules.ignored(rel, True) or _is_environment(e.path):
                        continue
                    stack.append(rel)
                    continue
                if rules.ignored(rel, False):
                    continue
                if stat.S_ISLNK(mode):
                    notes.add(_symlink_note(broot, rel, e.path))
                    continue
                if not stat.S_ISREG(mode):
                    notes.add(f"{shown(rel)}: a {_kind(mode)}, skipped")
                    continue
                if not os.access(e.path, os.R_OK):
                    notes.add(f"{shown(rel)}: not readable, skipped")
                    continue
                top = rel.split(b"/", 1)[0] + (b"/" if b"/" in rel else b"")
                per_top[top] += 1
                bytes_top[top] += st.st_size
                total += st.st_size
                heapq.heappush(biggest, (st.st_size, rel))
                if len(biggest) > 5:
                    heapq.heappop(biggest)
                found.append(
                    Found(rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode & 0o777)
                )
                if len(found) > caps.files or total > caps.bytes:
                    raise _too_big(root, caps, len(found), total, per_top, bytes_top, biggest)
    return found, notes


def _is_environment(path: bytes) -> bool:
    return os.path.exists(os.path.join(path, b"pyvenv.cfg")) or os.path.isdir(
        os.path.join(path, b"conda-meta")
    )


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _symlink_note(broot: bytes, rel: bytes, path: bytes) -> str:
    try:
        target = os.path.realpath(path)
    except OSError:
        target = b"?"
    inside = os.path.commonpath([os.path.realpath(broot), target]) == os.path.realpath(broot)
    where = "inside the folder" if inside else "out of the folder"
    return f"{shown(rel)}: a symlink to {shown(target)} ({where}), not followed"


def _too_big(
    root: Path,
    caps: Caps,
    files: int,
    total: int,
    per_top: Counter[bytes],
    bytes_top: Counter[bytes],
    biggest: list[tuple[int, bytes]],
) -> WorkspaceTooBig:
    if files > caps.files:
        what = f"over {caps.files:,} files"
        top = [f"{shown(n)} ({c:,}+ files)" for n, c in per_top.most_common(3)]
        example = per_top.most_common(1)[0][0]
    else:
        what = f"over {human_bytes(caps.bytes)}"
        big = sorted(biggest, reverse=True)[:3]
        top = [f"{shown(n)} ({human_bytes(s)})" for s, n in big]
        example = big[0][1] if big else b""
    line = shown(example) if example.endswith(b"/") else "/" + shown(example)
    return WorkspaceTooBig(
        f"the notebook's folder {root} is too big to sync ({what}); biggest: {', '.join(top)}",
        hint=f"exclude them in {root / IGNORE_FILE} (one pattern a line, e.g. `{line}`), or raise "
        "GPULAYER_WORKSPACE_MAX_FILES / GPULAYER_WORKSPACE_MAX_BYTES; the kernel starts without "
        "a workspace meanwhile",
        details={"folder": str(root), "files": files, "bytes": total, "biggest": top},
    )
