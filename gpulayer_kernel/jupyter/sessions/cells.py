"""Sessions in a notebook (ADR 0019): ``%gpulayer session ...``, push/pull, and session cells.

After ``%gpulayer session start`` the kernel has a *current* session: the ``%%gpulayer`` cells
below run inside it (``--session NAME`` picks one, ``--fresh`` keeps the one-shot job). A session
cell's output is rendered here as the kernel's own: streams through ``sys.stdout``/``stderr``,
display data through IPython's display publisher (figures, HTML, ``clear_output``), the last value
as ``Out[n]``, and a failure as the remote IPython traceback of its root-cause rank. With several
ranks, text is labelled ``[rank r]``. In widget mode and text mode alike: this is the notebook's
output area, not a widget.

Interrupting the kernel interrupts the cell on every rank (KeyboardInterrupt there; the session
keeps its state); a second interrupt within ``SECOND_INTERRUPT`` seconds restarts the session.
A kernel that shuts down stops the sessions it started; one that restarts leaves them running,
so the restarted kernel can ``%gpulayer session attach`` them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ... import display, jobopts
from ...contracts import (
    CellPage,
    CellState,
    LogRecord,
    SessionStatus,
)
from ...errors import GPUlayerError, Unavailable
from ...sessions import POLL, RECONNECT, CellResult, SessionHandle, follow_call
from ..handle import CellError, CellInterrupted

SESSION_HEADER = "# %%gpulayer\n"  # stands for the magic line: tracebacks say the cell's line
SECOND_INTERRUPT = 5.0  # seconds: a second interrupt within this restarts the session
# Options of %%gpulayer that shape a one-shot job; a session cell refuses them by name.
# The job options among them keep the defaults the one table gives them (jobopts.py).
ONE_SHOT_OPTIONS = {
    **{
        o.dest: (o.flag, o.default_for("cell"))
        for o in jobopts.options("cell")
        if o.flag not in ("--timeout", "--retry-on", "--label")
    },
    "files": ("--files", []),
    "name": ("--name", None),
    "worker": ("--worker", None),
    "no_wait": ("--no-wait", False),
    "handle": ("--handle", None),
}


class DisplayValue:
    """A value shown on a worker, shown here as ``Out[n]`` from its MIME bundle."""

    def __init__(self, content: dict[str, Any]) -> None:
        self.content = content

    @property
    def text(self) -> str:
        return display.text_of(self.content)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return dict(self.content.get("data") or {}), dict(self.content.get("metadata") or {})

    def __repr__(self) -> str:
        return self.text


class RankValues(list[Any]):
    """``--all-ranks``: every rank's displayed value, in rank order."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        for rank, value in enumerate(self):
            text = value.text if isinstance(value, DisplayValue) else repr(value)
            p.text(f"[rank {rank}] {text}\n" if rank < len(self) - 1 else f"[rank {rank}] {text}")


def one_shot_asked(args: Any) -> bool:
    """The cell gives an option only a one-shot job takes (``--gpus`` ...)."""
    return any(getattr(args, f, d) != d for f, (_, d) in ONE_SHOT_OPTIONS.items())


def run_session_cell(
    handle: SessionHandle, args: Any, code: str, ns: dict[str, Any], count: int | None
) -> Any:
    """Run a ``%%gpulayer`` cell in a session; returns what the cell shows as Out[n]."""
    for field, (option, default) in ONE_SHOT_OPTIONS.items():
        if getattr(args, field, default) != default:
            raise CellError(
                f"{option} is for one-shot jobs; this cell runs in session {handle.name}",
                hint="give it to %gpulayer session start, or run this cell as a one-shot "
                "job with %%gpulayer --fresh",
                code="session_option",
            )
    inputs = {n.strip(): kernel_value(ns, n.strip()) for s in args.inputs for n in s.split(",")}
    inputs = {k: v for k, v in inputs.items() if k}
    outputs = [args.out] if args.out else []
    # The notebook's folder (ADR 0022): synced sessions get this cell's changed files first.
    hooks = workspace_of(handle)
    if hooks is not None:
        handle.bridge.call(lambda s: hooks.before_execute())
    # Line 1 of a notebook cell is the %%gpulayer line: tracebacks count lines as it does
    # (a comment, not a blank line: IPython drops leading blank lines).
    result = drive(
        handle,
        SESSION_HEADER + code,
        inputs=inputs,
        outputs=outputs,
        all_ranks=args.all_ranks,
        count=count,
        timeout=args.timeout,
    )
    cell = result.cell
    if hooks is not None:  # its outputs back into the folder, before the next cell
        said = handle.bridge.call(lambda s: hooks.after_execute())
        if said:
            print(said, end="", file=sys.stderr)
    if cell.error is not None:
        from ...sessions import SessionCellError

        raise SessionCellError(cell, handle.name)
    if cell.state != CellState.OK:
        raise CellError(
            f"cell {cell.number} of session {handle.name} did not finish: "
            f"{cell.reason or cell.state.value}",
            hint=aborted_hint(handle),
            code="cell_aborted",
        )
    if args.out:
        if args.out not in result.outputs:
            raise CellError(
                f"--out {args.out}: {cell.reason or 'nothing came back'}",
                hint="end the cell with the value to assign, or assign a variable of that "
                "name in it",
                code="no_result",
            )
        ns[args.out] = result.outputs[args.out]
        return None
    if cell.all_ranks:
        ranks = sorted(cell.ranks, key=lambda r: r.rank)
        return RankValues(DisplayValue(r.value) if r.value else None for r in ranks)
    return DisplayValue(cell.value) if cell.value else None


_WORKSPACES: dict[str, Any] = {}  # session id -> its workspace hooks (workspace/kernel.py)


def workspace_of(handle: SessionHandle) -> Any:
    """A session's workspace hooks, opened on its first cell (None: it named no folder, or it
    runs in place: nothing to send)."""
    if handle.id in _WORKSPACES:
        return _WORKSPACES[handle.id]
    source = getattr(handle._info.job.spec.workload, "workspace", None)
    hooks = None
    if source is not None:
        from ...client.workspace import link_for
        from ...workspace.kernel import open_for_kernel

        async def opened(s: Any) -> Any:
            ws = await open_for_kernel(link_for(s), handle.id, source.folder)
            return ws if ws.engine is not None or ws._say else None

        hooks = handle.bridge.call(opened)
    _WORKSPACES[handle.id] = hooks
    return hooks


def kernel_value(ns: dict[str, Any], name: str) -> Any:
    if name and not name.isidentifier():
        raise CellError(f"--in {name!r} is not a variable name", hint="write --in a,b")
    if name and name not in ns:
        raise CellError(
            f"--in {name}: there is no variable {name!r} in the kernel",
            hint="define it in a cell above first",
        )
    return ns.get(name)


def drive(
    handle: SessionHandle,
    code: str,
    *,
    inputs: dict[str, Any] | None = None,
    outputs: Sequence[str] = (),
    all_ranks: bool = False,
    count: int | None = None,
    history: bool = True,
    timeout: float | None = None,
    show: Callable[[Sequence[LogRecord]], None] | None = None,
) -> CellResult:
    """Run one cell and render its output as it comes; Ctrl-C interrupts it on every rank."""
    ranks = max(1, handle._info.ranks)
    show = show or (lambda records: show_records(records, ranks))
    try:
        request = handle._request(code, inputs, outputs, all_ranks, count, history)
    except GPUlayerError as exc:
        raise CellError(exc.message, hint=exc.hint, details=exc.details, code=exc.code) from None
    page: CellPage | None = None
    interrupted_at: float | None = None
    deadline = None if timeout is None else time.monotonic() + timeout
    lost_at: float | None = None  # when the control plane stopped answering
    posted = time.time()
    while True:
        try:
            try:
                if page is None:
                    posted = time.time()
                    page = handle.bridge.call(lambda s: s.run_cell(handle.id, request, POLL))
                else:
                    left = POLL if deadline is None else max(0.05, deadline - time.monotonic())
                    page = handle.bridge.call(follow_call(handle.id, page, min(POLL, left)))
                lost_at = None
            except Unavailable:
                # A control plane that restarts resumes this cell under its own number: follow
                # that number again once it answers (never another cell's).
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    which = f"cell {page.cell.number}" if page is not None else "this cell"
                    print(
                        f"gpulayer: the control plane does not answer (restarting?): following "
                        f"{which} again when it is back",
                        file=sys.stderr,
                    )
                if now - lost_at > RECONNECT:
                    raise
                time.sleep(1.0)
                if page is None:
                    page = _posted(handle, request.code, posted)
                continue
            if page.records:
                show(page.records)
            if page.finished:
                return handle._result(page.cell, [])
            if deadline is not None and time.monotonic() >= deadline and interrupted_at is None:
                print(
                    f"gpulayer: the cell ran past --timeout {timeout:g}s: interrupting it",
                    file=sys.stderr,
                )
                handle.interrupt()
                interrupted_at, deadline = time.monotonic(), None
        except KeyboardInterrupt:
            now = time.monotonic()
            if interrupted_at is not None and now - interrupted_at <= SECOND_INTERRUPT:
                print(
                    f"gpulayer: second interrupt: restarting session {handle.name}",
                    file=sys.stderr,
                )
                handle.restart()
                raise CellInterrupted(
                    f"session {handle.name} was restarted: its ranks are new, its state is gone"
                ) from None
            interrupted_at = now
            handle.interrupt()
            print(
                "gpulayer: interrupted: KeyboardInterrupt sent to the cell on every rank (the "
                f"session keeps its state; interrupt again within {SECOND_INTERRUPT:g}s to "
                "restart it)",
                file=sys.stderr,
            )
            if page is None:  # interrupted before the cell's number came back: find it
                page = _newest(handle)
                if page is None:
                    raise CellInterrupted("the cell was interrupted before it started") from None


def _posted(handle: SessionHandle, code: str, since: float) -> CellPage | None:
    """This cell, when its POST's answer was lost: the newest cell with its code posted since
    ``since`` (None: not taken, or the control plane is still away; the caller retries)."""
    import hashlib

    digest = hashlib.sha256(code.encode()).hexdigest()
    try:
        cells = handle.cells(limit=5)
    except Unavailable:
        return None
    for cell in cells:  # 30 s: the server's clock and this one differ a little
        if cell.code_sha256 == digest and cell.submitted_at >= since - 30.0:
            return CellPage(cell=cell, records=[], next_since=cell.first_seq)
    raise CellError(
        "the control plane restarted before it took this cell: it did not run",
        hint="run the cell again",
        code="cell_not_taken",
    )


def aborted_hint(handle: SessionHandle) -> str:
    """What to do about a cell that did not finish, by how its session is now: a restart (its
    state lost) only for a broken one; a healthy one, whose cell was cut off by a control plane
    restart, keeps its state and runs the cell again."""
    try:
        status = handle.status
    except GPUlayerError:
        return f"`%gpulayer session show {handle.name}` says how the session is"
    if status == SessionStatus.BROKEN:
        return (
            f"%gpulayer session restart {handle.name} starts its ranks again (their state is lost)"
        )
    if status == SessionStatus.ENDED:
        return f"the session has ended: %gpulayer session start --name {handle.name}"
    return f"run the cell again: session {handle.name} is {status.value} and kept its state"


def _newest(handle: SessionHandle) -> CellPage | None:
    cells = handle.cells(limit=1)
    if not cells:
        return None
    return CellPage(cell=cells[0], records=[], next_since=cells[0].first_seq)


def show_records(records: Sequence[LogRecord], ranks: int = 1) -> None:
    """Render a session cell's records in this kernel's output, as a local cell's would be."""
    from IPython import get_ipython

    shell = get_ipython()
    pending: list[str] = []
    target = sys.stdout

    def flush() -> None:
        if pending:
            target.write("".join(pending))
            target.flush()
            pending.clear()

    for r in records:
        label = f"[rank {r.rank}] " if ranks > 1 and r.rank is not None else ""
        if r.stream == "display":
            flush()
            content: dict[str, Any] = dict(r.data or {})
            data: dict[str, Any] = dict(content.get("data") or {})
            if display.CLEAR in data:
                from IPython.display import clear_output

                clear = data[display.CLEAR]
                wait = bool(clear.get("wait")) if isinstance(clear, dict) else False
                clear_output(wait=wait)  # type: ignore[no-untyped-call]
                continue
            if label:
                sys.stdout.write(f"{label}\n")
                sys.stdout.flush()
            if shell is None:
                print(display.text_of(content))
                continue
            shell.display_pub.publish(
                data=data,
                metadata=content.get("metadata") or {},
                transient=content.get("transient") or None,
                update=bool(content.get("update")),
            )
            continue
        stream = sys.stderr if r.stream == "stderr" else sys.stdout
        if stream is not target:
            flush()
            target = stream
        if r.stream == "system":  # once: a note that names itself ("[gpulayer] …") is not
            text = "gpulayer: " + r.text.removeprefix("[gpulayer] ")  # said twice (issue 32)
        else:
            text = f"{label}{r.text}"
        pending.append(text + "\n")
    flush()
