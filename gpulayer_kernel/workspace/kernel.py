"""A GPU kernel's workspace on the Jupyter host: what the provisioner opens, what the relay calls.

The provisioner asks the control plane how the placed kernel's folder is made. In place: there
is nothing to do (the kernel runs in the notebook's folder). Synced: a :class:`HostWorkspace`
starts sending the folder at once, and the relay calls :meth:`KernelWorkspace.before_execute`
on each ``execute_request`` (the cell waits until its changed files are on the worker) and
:meth:`KernelWorkspace.after_execute` after each ``execute_reply`` (outputs come back; its
words go into the cell's output). A workspace that cannot be made (too big, a worker that
cannot take it) never stops the kernel: it starts without one and the first cell says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ..codes import ErrorCode
from ..errors import GPUlayerError
from .host import HostWorkspace, WorkspaceLink

log = logging.getLogger("gpulayer.workspace")


class KernelWorkspace:
    """The relay's two hooks for one kernel (no workspace: they only say why, once)."""

    def __init__(self, engine: HostWorkspace | None, note: str | None = None) -> None:
        self.engine = engine
        self._say: list[str] = [note] if note else []
        self._first: asyncio.Task[None] | None = None

    def begin(self) -> None:
        """Start sending the folder now (the first cell waits for it if it is not done)."""
        if self.engine is not None:
            self._first = asyncio.ensure_future(self.before_execute())

    async def before_execute(self) -> None:
        if self.engine is None:
            return
        try:
            await self.engine.before_cell()
        except GPUlayerError as exc:
            if exc.code == ErrorCode.WORKSPACE_TOO_BIG:
                self.engine.off = exc.message
            self._say.append(f"the workspace was not synced: {exc}")
        except Exception as exc:  # a kernel never stops for its workspace
            log.exception("workspace of %s", self.engine.root)
            self._say.append(f"the workspace was not synced: {exc!r}")

    async def after_execute(self) -> str | None:
        words, self._say = self._say, []
        if self.engine is not None:
            try:
                text = await self.engine.after_cell()
                if text:
                    words.append(text)
            except GPUlayerError as exc:
                words.append(f"outputs did not come back: {exc}")
            except Exception as exc:
                log.exception("workspace of %s", self.engine.root)
                words.append(f"outputs did not come back: {exc!r}")
        lines = [w if w.startswith("gpulayer:") else f"gpulayer: {w}" for w in words]
        return "\n".join(lines) + "\n" if lines else None

    def close(self) -> None:
        if self._first is not None:
            self._first.cancel()
        if self.engine is not None:
            self.engine.close()


async def open_for_kernel(link: WorkspaceLink, session_id: str, folder: str) -> KernelWorkspace:
    """(On the host loop, once the session is placed.) The kernel's workspace hooks."""
    view = None
    with contextlib.suppress(GPUlayerError):
        view = await link.view(session_id)
    if view is None:
        return KernelWorkspace(None)
    if view.mode == "in_place":
        log.info("workspace %s: in place on the worker at %s", folder, view.path)
        return KernelWorkspace(None)
    if view.mode == "none":
        return KernelWorkspace(None, f"no workspace: {view.reason}")
    ws = KernelWorkspace(HostWorkspace(Path(folder), session_id, link))
    ws.begin()
    return ws
