"""The kernel's sessions (ADR 0019): which one is current, which it started, and the line
commands ``%gpulayer session ...``, ``push`` and ``pull``.

After ``%gpulayer session start`` (or ``attach``) the kernel has a *current* session: the
``%%gpulayer`` cells below run in it (``cells.py``). Starting one shows its job while it
waits in the queue and starts (the job widget, or text), then one line: where it runs, how many
ranks, when it ends if idle. A kernel that shuts down stops the sessions it started; one that
restarts leaves them running (ipykernel's ``do_shutdown(restart)`` says which), so the restarted
kernel can ``%gpulayer session attach`` them — its client identity is new, and only a session's
holder runs cells in it.
"""

from __future__ import annotations

import atexit
import contextlib
import re
from pathlib import Path
from typing import Any, cast

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from ... import jobopts, render
from ...contracts import Job, JobState, SessionHolder, SessionInfo, SessionStatus
from ...contracts.workspace import WorkspaceSource
from ...errors import GPUlayerError
from ...sessions import SessionHandle, client_id, session_spec
from .. import textview
from ..bridge import Bridge, get_bridge
from ..cellspec import NOTEBOOK_LABEL, notebook_path
from ..handle import CellError, CellInterrupted
from . import link as sessionlink
from .cells import kernel_value


def _parser(command: str) -> MagicArgumentParser:
    parser: MagicArgumentParser = cast(Any, MagicArgumentParser)(prog=f"%gpulayer {command}")
    return parser


def default_name(notebook: str | None) -> str:
    """A session's name when none is given: its notebook's file name (``train`` for
    ``work/train.ipynb``), else ``session``."""
    if not notebook:
        return "session"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(notebook).stem).strip("-._")
    return stem[:63] or "session"


class KernelSessions:
    """This kernel's sessions: the current one, those it started, and its holder identity."""

    def __init__(self) -> None:
        self.client = client_id()
        self.current: SessionHandle | None = None
        self.started: dict[str, SessionHandle] = {}
        self.restarting = False  # the kernel shuts down to restart: leave sessions running
        self.offered = False  # the attach hint of sessionlink.offer_attach was looked for

    def holder(self, ns: dict[str, Any]) -> SessionHolder:
        from ..widget import kernel_id

        return SessionHolder(
            client=self.client, notebook=notebook_path(ns), kernel=kernel_id() or None
        )

    def handle(self, ref: str | None) -> SessionHandle:
        """The session a cell names (``--session``), else the current one."""
        if ref is None:
            if self.current is None:
                raise CellError(
                    "this kernel has no session",
                    hint="start one with %gpulayer session start (or attach: "
                    "%gpulayer session attach NAME)",
                    code="no_session",
                )
            return self.current
        if self.current is not None and ref in (self.current.name, self.current.id):
            return self.current
        bridge = get_bridge()
        info = bridge.call(lambda s: s.get_session(ref))
        return SessionHandle(bridge, info, self.client)

    # -- starting and stopping -------------------------------------------------------------------

    def start(self, args: Any, ns: dict[str, Any], view: textview.JobView) -> SessionHandle:
        bridge = get_bridge()
        holder = self.holder(ns)
        name = args.name or default_name(holder.notebook)
        fields = jobopts.job_fields(args, "session")
        spec = session_spec(
            name,
            **fields["resources"],
            idle_timeout=fields["idle_timeout"],
            env=fields["env"],
            secrets=fields["secrets"],
            labels={NOTEBOOK_LABEL: holder.notebook} if holder.notebook else {},
            wait_for_capacity=fields["wait_for_capacity"],
            holder=holder,
            workspace=here(),
        )
        info = bridge.call(lambda s: s.start_session(spec))
        handle = SessionHandle(bridge, info, self.client)
        self.started[info.id] = handle
        try:
            wait_until_up(bridge, info, view)
        except KeyboardInterrupt:
            view.note(f"interrupted: stopping session {name} (it had not started)")
            handle.stop()
            raise CellInterrupted(f"session {name} was stopped before it started") from None
        self.current = handle
        return handle

    def forget(self, handle: SessionHandle) -> None:
        self.started.pop(handle.id, None)
        if self.current is not None and self.current.id == handle.id:
            self.current = None

    def at_exit(self) -> None:
        """The kernel exits: stop the sessions it started, unless it is restarting."""
        if self.restarting:
            return
        for handle in list(self.started.values()):
            with contextlib.suppress(Exception):
                handle.stop("stopped: the notebook's kernel shut down")
        self.started.clear()


_sessions: KernelSessions | None = None


def kernel_sessions() -> KernelSessions:
    """This kernel's sessions (made on first use; stops what it started when the kernel exits)."""
    global _sessions
    if _sessions is None:
        _sessions = KernelSessions()
        atexit.register(_sessions.at_exit)  # after the bridge's: runs before it closes
        _hook_restart(_sessions)
    return _sessions


def _hook_restart(sessions: KernelSessions) -> None:
    """Tell a restart from a shutdown: ipykernel passes ``restart`` to ``do_shutdown``."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    original = getattr(kernel, "do_shutdown", None)
    if kernel is None or original is None or getattr(original, "__gl_hooked__", False):
        return

    def do_shutdown(restart: bool, *args: Any, **kwargs: Any) -> Any:
        sessions.restarting = bool(restart)
        return original(restart, *args, **kwargs)

    do_shutdown.__gl_hooked__ = True  # type: ignore[attr-defined]
    kernel.do_shutdown = do_shutdown


def here() -> WorkspaceSource:
    """The kernel's folder (the notebook's, as Jupyter starts kernels): the session's workspace
    (ADR 0022), in place where its worker sees it, synced otherwise."""
    import os

    from ...workspace.plan import host_id

    return WorkspaceSource(folder=os.getcwd(), host=host_id())


def wait_until_up(bridge: Bridge, info: SessionInfo, view: textview.JobView) -> SessionInfo:
    """Show the session's job while it waits and starts (queue, placement), until it is up."""
    import queue

    from ..bridge import Update

    updates: queue.Queue[Update] = queue.Queue()
    watch = bridge.watch(info.id, updates.put)
    try:
        while True:
            try:
                u = updates.get(timeout=1.0)
            except queue.Empty:
                continue
            job = u.job
            if u.kind == "logs":
                view.add_logs(u.records)
                continue
            if u.kind == "error":
                raise CellError(f"following the session failed: {u.error}")
            if job is None:
                continue
            view.update(job)
            if job.state == JobState.RUNNING or job.state.terminal:
                break
    finally:
        watch.stop()
    now = bridge.call(lambda s: s.get_session(info.id))
    if now.status == SessionStatus.ENDED:
        view.finish(now.job)
        raise CellError(
            f"session {info.name} did not start: {now.job.state.value}"
            + (f": {now.reason}" if now.reason else ""),
            hint="its log above says why; `%gpulayer explain` says where it would fit",
            code="session_failed",
        )
    return now


def transfer_in(handle: SessionHandle, ns: dict[str, Any], names: list[str]) -> str:
    """``%gpulayer push``: kernel variables into the session (on every rank)."""
    values = {n: kernel_value(ns, n) for n in names}
    try:
        moved = handle.push(values)
    except GPUlayerError as exc:
        raise CellError(exc.message, hint=exc.hint, details=exc.details, code=exc.code) from None
    return moved.describe("pushed", handle.name)


def transfer_out(handle: SessionHandle, ns: dict[str, Any], names: list[str]) -> str:
    """``%gpulayer pull``: session variables (rank 0's) into the kernel."""
    try:
        values, moved = handle.pull_with_stats(names)
    except GPUlayerError as exc:
        raise CellError(exc.message, hint=exc.hint, details=exc.details, code=exc.code) from None
    ns.update(values)
    return moved.describe("pulled", handle.name)


def session_command(argv: list[str], ns: dict[str, Any], widget: bool) -> None:
    """``%gpulayer session [start|list|show|stop|restart|attach|interrupt] ...``."""
    sessions = kernel_sessions()
    action = argv[0] if argv and not argv[0].startswith("-") else "show"
    rest = argv[1:] if argv and not argv[0].startswith("-") else argv
    if action == "start":
        a = _session_start_parser().parse_args(rest)
        bridge = get_bridge()
        view = _LazyWidget(bridge) if widget else textview.TextView()
        handle = sessions.start(a, ns, view)
        info = handle.info
        print(
            f"session {info.name} is up: {render.session_line(info)}. The %%gpulayer cells "
            "below run in it (%%gpulayer --fresh for a one-shot job)."
        )
        return
    if action == "list":
        p = _parser("session list")
        p.add_argument("--all", action="store_true", help="also sessions that ended")
        every = p.parse_args(rest).all
        infos = get_bridge().call(lambda s: s.list_sessions(include_ended=every))
        if sessions.current is not None and not any(
            i.id == sessions.current.id and i.status != SessionStatus.ENDED for i in infos
        ):
            # It ended or went: say so, rather than list without it.
            sessionlink.say_if_lost(sessions)
        current = sessions.current.id if sessions.current else None
        for info in infos:
            print(("* " if info.id == current else "  ") + render.session_line(info))
        if not infos:
            print("no sessions (start one with %gpulayer session start)")
        return
    p = _parser(f"session {action}")
    p.add_argument("name", nargs="?" if action != "attach" else None, help="the session")
    ref = p.parse_args(rest).name
    if action == "attach":
        handle = sessions.handle(ref)
        handle.attach(sessions.holder(ns))
        sessions.current = handle
        print(f"attached: {render.session_line(handle.info)}")
        return
    handle = sessions.handle(ref)
    if action == "show":
        info = handle.info
        print(render.session_line(info))
        for c in handle.cells(limit=10):
            print(f"  {render.cell_line(c)}")
    elif action == "stop":
        info = handle.stop()
        sessions.forget(handle)
        print(f"session {info.name} stopped: its GPUs are free")
    elif action == "restart":
        info = handle.restart()
        print(f"session {info.name} restarted (its state is gone): {render.session_line(info)}")
    elif action == "interrupt":
        handle.interrupt()
        print(f"KeyboardInterrupt sent to the running cell of session {handle.name}")
    else:
        raise UsageError(
            f"unknown session command {action!r}: use start, list, show, stop, restart, "
            "attach or interrupt (%gpulayer help)"
        )


def push_command(argv: list[str], ns: dict[str, Any]) -> None:
    p = _parser("push")
    p.add_argument("names", help="kernel variables, comma-separated: x,y")
    p.add_argument("--session", default=None, help="default: the kernel's current session")
    a = p.parse_args(argv)
    handle = kernel_sessions().handle(a.session)
    print(transfer_in(handle, ns, _names(a.names)))


def pull_command(argv: list[str], ns: dict[str, Any]) -> None:
    p = _parser("pull")
    p.add_argument("names", help="session variables, comma-separated: x,y")
    p.add_argument("--session", default=None, help="default: the kernel's current session")
    a = p.parse_args(argv)
    handle = kernel_sessions().handle(a.session)
    print(transfer_out(handle, ns, _names(a.names)))


def _session_start_parser() -> MagicArgumentParser:
    p = _parser("session start")
    p.add_argument("--name", default=None, help="default: the notebook's file name")
    jobopts.add_arguments(p, "session")  # --gpus, --gpu-kind, ... (one table for every edge)
    return p


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not n.isidentifier():
            raise CellError(f"{n!r} is not a variable name", hint="write x,y")
    return names


class _LazyWidget:
    """The job widget of a starting session, made at its first update (the job exists then)."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.widget: Any = None

    def _ensure(self, job: Job) -> Any:
        if self.widget is None:
            from IPython.display import display

            from ..widget import JobWidget

            self.widget = JobWidget(self.bridge, job, blocking=True)
            display(self.widget)  # type: ignore[no-untyped-call]
        return self.widget

    def update(self, job: Job) -> None:
        self._ensure(job).update(job)

    def add_logs(self, records: Any) -> None:
        if self.widget is not None:
            self.widget.add_logs(records)

    def note(self, text: str) -> None:
        if self.widget is not None:
            self.widget.note(text)

    def finish(self, job: Job) -> None:
        self._ensure(job).finish(job)
