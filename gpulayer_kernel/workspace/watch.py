"""The change detector: which files changed since the last cell, for (almost) nothing.

On Linux it reads inotify (``inotify_simple``): one watch per folder of the workspace, and each
cell drains the events the kernel queued, without blocking. The kernel queues an event before the
write that caused it returns, so a file saved in Lab before the cell was run is always in the
queue when the cell's request arrives; a drain with nothing in it costs ~2 µs, against ~30 ms for
a stat of every file of a 10k-file folder (measured; ``benchmarks/bench_workspace.py``).
``watchfiles`` was measured too: its Rust thread reports changes after a debounce step, so a save
followed at once by a run could be missed; a detector must never miss.

Anything it cannot follow — a new folder, a queue overflow, no inotify (macOS, a watch limit
reached) — makes ``drain`` answer None: look at everything (the mtime index keeps that to stats).
"""

from __future__ import annotations

import contextlib
import logging
import os

from .scan import Rules

log = logging.getLogger("gpulayer.workspace")


class Detector:
    """Changed paths of one folder since the last ``drain`` (None: look at everything)."""

    def __init__(self, root: str | os.PathLike[str], rules: Rules) -> None:
        self.root = os.fsencode(root)
        self.rules = rules
        self._ino = None
        self._dirs: dict[int, bytes] = {}
        self._lost = True  # until watches are up: everything is news
        self._again: set[bytes] = set()
        try:
            import inotify_simple

            self._ino = inotify_simple.INotify()
            self._flags = inotify_simple.flags
        except (ImportError, OSError) as exc:
            log.info("no inotify here (%s): each cell stats the workspace", exc)

    def start(self) -> None:
        """Watch every folder of the workspace (call before the first full scan)."""
        if self._ino is None:
            return
        self._lost = False
        self._watch_tree(b"")

    def _watch_tree(self, rel: bytes) -> None:
        assert self._ino is not None
        f = self._flags
        mask = (
            f.CLOSE_WRITE
            | f.MODIFY
            | f.ATTRIB
            | f.CREATE
            | f.DELETE
            | f.MOVED_FROM
            | f.MOVED_TO
            | f.DELETE_SELF
            | f.MOVE_SELF
            | f.DONT_FOLLOW
            | f.ONLYDIR
        )
        stack = [rel]
        while stack:
            d = stack.pop()
            path = os.path.join(self.root, d) if d else self.root
            try:
                wd = self._ino.add_watch(path, mask)
            except OSError as exc:
                log.info("inotify watch on %r failed (%s): each cell stats the workspace", d, exc)
                self.close()
                return
            self._dirs[wd] = d
            with contextlib.suppress(OSError), os.scandir(path) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        sub = d + b"/" + e.name if d else e.name
                        if not self.rules.ignored(sub, True):
                            stack.append(sub)

    def dirty(self, rel: bytes) -> None:
        """Make ``rel`` news at the next drain (a file that could not be sent this time)."""
        self._again.add(rel)

    def lose(self) -> None:
        """Make the next drain answer None (look at everything): what a drain said could not
        be used."""
        self._lost = True

    def drain(self) -> set[bytes] | None:
        """Paths (relative) that changed since the last call; None when that is not known."""
        if self._ino is None:
            return None
        events = self._ino.read(timeout=0)
        changed, self._again = self._again, set()
        lost = self._lost
        self._lost = False
        f = self._flags
        for ev in events:
            if ev.mask & f.Q_OVERFLOW:
                lost = True
                continue
            base = self._dirs.get(ev.wd)
            if base is None:
                continue
            name = os.fsencode(ev.name) if isinstance(ev.name, str) else ev.name
            rel = base + b"/" + name if base and name else (name or base)
            if ev.mask & f.ISDIR:
                if ev.mask & (f.CREATE | f.MOVED_TO):
                    self._watch_tree(rel)
                lost = True  # a folder came or went: its files are news
                continue
            if ev.mask & (f.DELETE_SELF | f.MOVE_SELF | f.IGNORED):
                self._dirs.pop(ev.wd, None)
                lost = True
                continue
            if rel:
                changed.add(rel)
        return None if lost else changed

    def close(self) -> None:
        if self._ino is not None:
            with contextlib.suppress(OSError):
                self._ino.close()
            self._ino = None
