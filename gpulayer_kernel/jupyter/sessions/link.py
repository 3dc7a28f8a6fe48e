"""A notebook's link to its current session, kept true (ADR 0019): a session stopped or taken
over by someone else is noticed by the next cell, which clears the link and says so in one line
(the cells after it are one-shot jobs again); a session this notebook started before its kernel
restarted is offered for ``attach`` in one hint, once.

Nothing here costs a session cell a request: the link is checked when a cell's run is refused
(the session ended, is held by another client, or is gone), or before a cell that asks for a
one-shot job's options; the hint is looked for once per kernel, at its first one-shot cell.
"""

from __future__ import annotations

import sys
from typing import Protocol

from ...codes import ErrorCode
from ...contracts import SessionStatus
from ...errors import GPUlayerError
from ...sessions import SessionHandle
from ..handle import CellError


class KernelSessions(Protocol):
    """What this module reads and clears of a kernel's sessions (``current.py``'s, which
    calls in here: a protocol, so the link sits below it and imports nothing back)."""

    client: str
    current: SessionHandle | None
    offered: bool

    def forget(self, handle: SessionHandle) -> None: ...


# A session cell refused with one of these: the kernel's link to its session may no longer
# hold (``cell_aborted``: a cell taken just as its session was being stopped).
LOST = frozenset({"session_ended", "session_held", "session_not_found", "cell_aborted"})


def link_lost(sessions: KernelSessions) -> str | None:
    """Why the current session is no longer this kernel's (ended, taken over, gone), after
    clearing the link; None while it still is."""
    handle = sessions.current
    if handle is None:
        return None
    try:
        info = handle.bridge.call(lambda s: s.get_session(handle.id))
    except GPUlayerError as exc:
        if exc.code != ErrorCode.SESSION_NOT_FOUND:
            raise
        why = "is gone"
    else:
        if info.status == SessionStatus.ENDED:
            why = f"has ended ({info.job.state.value}" + (
                f": {info.reason})" if info.reason else ")"
            )
        elif info.holder.client != sessions.client:
            why = f"was taken over by {info.holder.label}"
        else:
            return None
    sessions.forget(handle)  # not ours to stop when this kernel exits, either
    sessions.offered = True  # nor to offer for attach: its loss was just said
    return (
        f"session {handle.name} {why}: this notebook's link to it is cleared, and "
        "%%gpulayer cells run as one-shot jobs again"
    )


def lost_cell(sessions: KernelSessions, exc: GPUlayerError) -> CellError | None:
    """The one-line error of a session cell refused because its link no longer holds."""
    if exc.code not in LOST:
        return None
    line = link_lost(sessions)
    return None if line is None else CellError(line, code="session_link_lost")


def say_if_lost(sessions: KernelSessions) -> None:
    """Before a cell that asks for a one-shot job's options: a lost link is cleared (one
    line) and the cell runs as the one-shot job it asks for."""
    line = link_lost(sessions)
    if line is not None:
        print(f"gpulayer: {line}", file=sys.stderr)


def offer_attach(sessions: KernelSessions, notebook: str | None) -> None:
    """Once per kernel: a live session this notebook (or this kernel, before a restart)
    started, now held by no one here, is offered for ``attach`` in one hint."""
    if sessions.offered:
        return
    sessions.offered = True
    from ..bridge import get_bridge
    from ..widget import kernel_id

    kernel = kernel_id()
    try:
        infos = get_bridge().call(lambda s: s.list_sessions())
    except GPUlayerError:
        return  # a hint is not worth failing the cell for
    ours = [
        i
        for i in infos
        if i.status != SessionStatus.ENDED
        and i.holder.client != sessions.client
        and ((kernel and i.holder.kernel == kernel) or (notebook and i.holder.notebook == notebook))
    ]
    if ours:
        names = ", ".join(i.name for i in ours)
        print(
            f"gpulayer: hint: session {names}, started from this notebook before its kernel "
            f"restarted, is still live: %gpulayer session attach {ours[0].name} (this cell "
            "runs as a one-shot job)",
            file=sys.stderr,
        )
