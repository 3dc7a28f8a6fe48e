"""The IPython extension: ``%%gpulayer`` runs a cell as a GPUlayer job, ``%gpulayer`` manages jobs.

``%load_ext gpulayer_kernel`` registers both and opens the kernel's bridge in the background: to
the served control plane when ``GPULAYER_URL`` is set (the Jupyter server extension sets it), else
to the embedded default in this process, so a notebook runs the same in JupyterLab, plain IPython,
nbconvert or nbval. A thin edge: parse the options, build the job from them (``cellspec.py``:
bundle, ``--in`` values, ``--env``, the notebook label), call the control plane, render. The cell
source (+ ``--files``) becomes a content-addressed bundle uploaded only when the control plane
lacks its digest; the worker runs it with ``python -m gpulayer_kernel.job.runner cell:cell.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ..errors import GPUlayerError, MissingExtra

try:
    from IPython.core import magic, magic_arguments
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.magic import Magics, magics_class
    from IPython.core.magic_arguments import MagicArgumentParser
except ImportError as exc:  # a wheel installed without the jupyter extra
    raise MissingExtra.of("jupyter", "the %%gpulayer magics", exc) from None

from .. import jobopts, render, transfer
from ..contracts import Job, JobSpec, parse
from ..contracts.results import CellResult, ShownValue
from ..job.runner import LAST_VALUE
from ..sessions import SessionCellError
from ..workspace import cells as workspace_cells
from . import line_commands, textview
from .bridge import Bridge, get_bridge
from .cellspec import (
    CELL_FILE,
    NOTEBOOK_LABEL,
    bundle,
    cell_error,
    cell_inputs,
    check_kernel_names,
    check_syntax,
    notebook_path,
)
from .display_mode import display_mode
from .handle import CellError, JobHandle, NoResult, follow, result_of
from .sessions import link as sessionlink
from .sessions.cells import one_shot_asked, run_session_cell
from .sessions.current import kernel_sessions

_F = TypeVar("_F", bound=Callable[..., Any])
# IPython's magic_arguments is untyped, and its magic markers return a union; typed views of them:
argument = cast(Callable[..., Callable[[_F], _F]], magic_arguments.argument)
magic_args = cast(Callable[[str], Callable[[_F], _F]], magic_arguments.magic_arguments)
parse_argstring = cast(Callable[[Any, str], Any], magic_arguments.parse_argstring)
cell_magic = cast(Callable[[str], Callable[[_F], _F]], magic.cell_magic)
line_magic = cast(Callable[[str], Callable[[_F], _F]], magic.line_magic)

_last: JobHandle | None = None


class _JobOptions(magic_arguments.ArgDecorator):
    """A ``magic_arguments`` decorator adding the cell edge's job options from ``jobopts``."""

    def add_to_parser(self, parser: Any, group: Any) -> None:
        jobopts.add_arguments(parser if group is None else group, "cell")


job_options = cast(Callable[[], Callable[[_F], _F]], _JobOptions)


def last_job() -> JobHandle | None:
    """The handle of the last job a ``%%gpulayer`` cell submitted in this kernel."""
    return _last


class Shown:
    """A one-shot cell's last value that JSON could not carry, shown from the MIME bundle the
    worker made of it (as a session cell's value is: HTML, images, text), or its text form."""

    def __init__(self, shown: ShownValue) -> None:
        self.shown = shown
        self.text, self.kind, self.content = shown.text, shown.type, shown.display

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.content is None:
            return {"text/plain": self.text}, {}
        return dict(self.content.get("data") or {}), dict(self.content.get("metadata") or {})

    def __repr__(self) -> str:
        return self.text


@magics_class
class GPUlayerMagics(Magics):
    """``%%gpulayer`` (run a cell as a job) and ``%gpulayer`` (status, jobs, logs, cancel...)."""

    @property
    def ns(self) -> dict[str, Any]:
        assert self.shell is not None
        ns: dict[str, Any] = self.shell.user_ns
        return ns

    # -- %%gpulayer --------------------------------------------------------------------------------

    @magic_args("%gpulayer")
    @argument("-h", "--help", action="store_true", help="show this help; submit nothing")
    @job_options()  # --gpus, --gpu-kind, ... as jobopts.py declares them for every edge
    @argument(
        "--in",
        dest="inputs",
        action="append",
        default=[],
        metavar="a,b",
        help="kernel variables sent to the job as JSON and bound to the same names",
    )
    @argument(
        "--out",
        default=None,
        metavar="NAME",
        help="assign the cell's result (its last expression, or job.result(...)) to NAME",
    )
    @argument(
        "--files",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATH",
        help="local files or folders bundled with the cell (relative to the notebook)",
    )
    @argument("--name", default=None, help="the job's name (default: cell)")
    @argument(
        "--no-wait",
        action="store_true",
        help="return a JobHandle at once: .result(), .logs(), .cancel(), .wait(), .job",
    )
    @argument("--handle", default=None, metavar="NAME", help="also bind the JobHandle to NAME")
    @argument(
        "--session",
        default=None,
        metavar="NAME",
        help="run the cell in this session (default: the kernel's current one, if any)",
    )
    @argument(
        "--fresh",
        action="store_true",
        help="run the cell as a one-shot job even though the kernel has a session",
    )
    @argument(
        "--all-ranks",
        action="store_true",
        help="in a multi-rank session, show every rank's value (a list), not rank 0's",
    )
    @cell_magic("gpulayer")
    def gpulayer_cell(self, line: str, cell: str) -> Any:
        """Run this cell as a GPUlayer job and bring its logs and result back.

        The cell runs as plain Python on a worker, in a fresh namespace: ``--in`` variables are
        bound, and the value of its last expression (or what it passes to
        ``gpulayer_kernel.job.result``) is its result, as JSON, shown like a local cell's Out
        (a value JSON cannot carry is shown by its text form; only ``--out`` needs JSON; the
        work is never failed for it). Files it writes to
        ``$GPULAYER_OUTPUT`` come back as artifacts (``handle.artifacts``). Interrupting the kernel
        cancels the job.
        """
        try:
            args = parse_argstring(self.gpulayer_cell, line)
        except GPUlayerError as exc:  # a job option's bad value (jobopts.BadOption)
            raise cell_error(exc) from None
        except UsageError as exc:
            usage = _cell_parser().format_usage().replace("::\n\n  ", "usage: ", 1)
            raise UsageError(f"{exc}\n{usage}see all options with %%gpulayer --help") from None
        if args.help:
            print(_cell_parser().format_help().replace("::\n\n  ", "usage: ", 1))
            return None
        try:
            return self._run_cell(args, cell)
        except (CellError, SessionCellError):
            raise  # they render themselves (a remote traceback, a message and a hint)
        except GPUlayerError as exc:
            raise cell_error(exc) from None

    def _run_cell(self, args: Any, cell: str) -> Any:
        global _last
        sessions = kernel_sessions()
        if args.session is not None and args.fresh:
            raise CellError("--session and --fresh contradict each other: pick one")
        if args.out is not None and not args.out.isidentifier():
            raise CellError(f"--out {args.out!r} is not a valid Python variable name")
        if args.session is None and sessions.current is not None and one_shot_asked(args):
            sessionlink.say_if_lost(sessions)  # a lost link: the one-shot job it asks for
        if not args.fresh and (args.session is not None or sessions.current is not None):
            if not cell.strip():
                raise CellError("the cell is empty", hint="write the code to run below %%gpulayer")
            assert self.shell is not None
            session = sessions.handle(args.session)
            try:
                return run_session_cell(session, args, cell, self.ns, _running_count(self.shell))
            except GPUlayerError as exc:
                lost = sessionlink.lost_cell(sessions, exc) if args.session is None else None
                if lost is None:
                    raise
                raise lost from None
        if args.session is None and not args.fresh:
            sessionlink.offer_attach(sessions, notebook_path(self.ns))
        if args.all_ranks:
            raise CellError(
                "--all-ranks is for session cells",
                hint="a one-shot job's value is rank 0's; start a session to see every rank's",
            )
        if args.out is not None and args.no_wait:
            raise CellError(
                "--out needs the cell to wait for its result",
                hint="with --no-wait, take the result from the handle: handle.result()",
            )
        for flag, name in (("--out", args.out), ("--handle", args.handle)):
            if name is not None and not name.isidentifier():
                raise CellError(f"{flag} {name!r} is not a valid Python variable name")
        if not cell.strip():
            raise CellError("the cell is empty", hint="write the code to run below %%gpulayer")
        check_syntax(cell)
        check_kernel_names(cell, self.ns, args.inputs)
        inputs, moved = cell_inputs(self.ns, args.inputs)
        digest, data = bundle(cell, args.files, moved)
        notebook = notebook_path(self.ns)
        fields = jobopts.job_fields(args, "cell")
        spec = parse(
            JobSpec,
            {
                **fields,
                "name": args.name or "cell",
                "workload": {
                    "kind": "python",
                    "bundle": digest,
                    "entrypoint": f"cell:{CELL_FILE}",
                    "args": inputs,
                },
                "env": fields["env"] | ({transfer.OUT_ENV: "1"} if args.out else {}),
                "labels": fields["labels"] | ({NOTEBOOK_LABEL: notebook} if notebook else {}),
            },
        )
        bridge = get_bridge()
        # The notebook's folder where the cell runs (ADR 0022): in place, or a worker's copy.
        ws = workspace_cells.prepare(bridge, spec, files=bool(args.files))
        _say(ws.said())
        bridge.upload_bundle(digest, data)
        job = bridge.submit(ws.spec)
        widget = _widget(bridge, job, blocking=not args.no_wait)
        handle = JobHandle(bridge, job, widget)
        _last = handle
        if args.handle:
            self.ns[args.handle] = handle
        if args.no_wait:
            ws.later(bridge, job.id)  # its outputs come back when it ends
            if widget is not None:
                bridge.watch(job.id, widget.feed)
            else:
                bridge.wait_scheduled(job.id)  # so the handle shown says where it went or why not
            return handle
        if widget is not None:
            from IPython.display import display

            display(widget)  # type: ignore[no-untyped-call]  # IPython.display is untyped
        view: textview.JobView = textview.TextView() if widget is None else widget
        final = follow(bridge, job.id, view)
        _say(ws.finish(bridge, final))  # its outputs, back into the folder
        value = result_of(
            final, said_why=isinstance(view, textview.TextView) and view.said_why(final)
        )
        result = CellResult.of_wire(value)
        shown = Shown(result.shown) if result.shown is not None else None
        value = result.value
        if args.out is not None:
            if result.artifact is not None:
                # A tensor, an array or a dict of them: it came back tensor-safe, as an artifact.
                back = transfer.decode(handle.read_artifact(result.artifact))
                self.ns[args.out] = back[LAST_VALUE]
                return None
            if shown is not None:
                # The work succeeded; only the assignment cannot happen. Say so, show the value.
                why = result.refused or f"a {shown.kind} is not JSON"
                print(
                    f"gpulayer: --out {args.out}: {why}, so {args.out} was not assigned; the "
                    "value is shown below (end the cell with JSON, tensors or arrays, or save it "
                    "to $GPULAYER_OUTPUT as an artifact)",
                    file=sys.stderr,
                )
                return shown
            if value is None:
                raise NoResult(
                    f"--out {args.out}: the cell produced no value, so nothing was assigned",
                    hint="end the cell with an expression, or call "
                    "gpulayer_kernel.job.result(value) in it",
                )
            self.ns[args.out] = value
            return None
        # Without --out, the cell's last value is shown as a local cell's would be (Out[n]).
        return shown if shown is not None else value

    # -- %gpulayer ---------------------------------------------------------------------------------

    @line_magic("gpulayer")
    def gpulayer_line(self, line: str) -> Any:
        """Manage GPUlayer from a notebook: ``%gpulayer COMMAND [ARGS]``.

        Commands: status, workers, jobs [--state S] [--limit N], logs JOB, show JOB, explain JOB,
        cancel JOB, connect URL [--token T], local [--home DIR] [--simulate-gpus N]
        [--simulate-kind KIND], display auto|widget|text, help. JOB is a job id (or a unique
        prefix of 4+ characters).
        """
        try:
            return line_commands.run(line, self.ns)
        except GPUlayerError as exc:
            shown = isinstance(exc, (CellError, SessionCellError))
            raise exc if shown else cell_error(exc) from None


def _say(words: str | None) -> None:
    if words:
        print(words, end="", file=sys.stderr)


def _running_count(shell: InteractiveShell) -> int | None:
    """The number of the cell running now (In[n]): IPython counts it before it runs it."""
    running = getattr(shell.displayhook, "exec_result", None)
    count = getattr(running, "execution_count", None)
    return count if isinstance(count, int) else shell.execution_count


def _cell_parser() -> MagicArgumentParser:
    """The parser magic_arguments built for ``%%gpulayer`` (its options and their help)."""
    parser: MagicArgumentParser = GPUlayerMagics.gpulayer_cell.parser  # type: ignore[attr-defined]
    return parser


def _widget(bridge: Bridge, job: Job, *, blocking: bool) -> Any:
    if display_mode() != "widget":
        return None
    from .widget import JobWidget

    return JobWidget(bridge, job, blocking=blocking)


def _job_text(obj: Job, p: Any, cycle: bool) -> None:
    p.text(render.summary(obj))


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext gpulayer_kernel``: register the magics and open the bridge in the background."""
    ipython.register_magics(GPUlayerMagics)
    if ipython.display_formatter is not None:
        ipython.display_formatter.formatters["text/plain"].for_type(Job, _job_text)
    get_bridge()  # starts opening now (a local worker probes its GPUs: ~1-2 s)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    from .bridge import close_bridge

    close_bridge()
