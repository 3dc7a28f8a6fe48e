"""``%gpulayer COMMAND``: managing GPUlayer from a notebook (status, jobs, logs, connect, …).

Each command is a function of its arguments and the kernel's namespace (``ns``, for the session
commands that move variables); ``run`` parses the line and dispatches. The ``%%gpulayer`` cell
magic itself, which runs a cell as a job, is ``magics.py``.
"""

from __future__ import annotations

import getpass
import shlex
from collections.abc import Callable
from typing import Any, cast

from IPython.core.error import StdinNotImplementedError, UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from .. import render
from ..contracts import JobState
from ..errors import MissingExtra
from ..words import count, plain
from .bridge import Target, get_bridge, reconnect
from .display_mode import DISPLAY_MODES, display_mode, set_display_mode
from .handle import CellError
from .sessions.current import pull_command, push_command, session_command

new_parser = cast(Callable[..., MagicArgumentParser], MagicArgumentParser)


def run(line: str, ns: dict[str, Any]) -> Any:
    """Run one ``%gpulayer`` line (no command: ``status``)."""
    words = shlex.split(line)
    command = words[0] if words else "status"
    if command in ("help", "-h", "--help"):
        print(HELP)
        return None
    handler = COMMANDS.get(command)
    if handler is None:
        raise UsageError(f"unknown command {command!r}\n{HELP}")
    return handler(words[1:], ns)


def _parser(command: str) -> MagicArgumentParser:
    return new_parser(prog=f"%gpulayer {command}")


def _status(argv: list[str], ns: dict[str, Any]) -> None:
    _parser("status").parse_args(argv)
    bridge = get_bridge()
    workers = bridge.workers()
    jobs = bridge.jobs(limit=1000)
    print(f"GPUlayer: {bridge.describe()}")
    gpus = sum(len(w.capabilities.devices) for w in workers)
    sim = " (simulated)" if any(w.capabilities.simulated for w in workers) else ""
    print(f"workers: {len(workers)}, GPUs: {gpus}{sim}")
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.state.value] = counts.get(j.state.value, 0) + 1
    shown = ", ".join(f"{counts[s.value]} {s.value}" for s in JobState if s.value in counts)
    print(f"jobs: {shown or 'none yet'}")
    print(f"display: {display_mode()}")


def _workers(argv: list[str], ns: dict[str, Any]) -> None:
    _parser("workers").parse_args(argv)
    print(render.workers_table(get_bridge().workers()))


def _jobs(argv: list[str], ns: dict[str, Any]) -> None:
    p = _parser("jobs")
    p.add_argument("--state", action="append", default=[], choices=[s.value for s in JobState])
    p.add_argument("--limit", type=int, default=20)
    a = p.parse_args(argv)
    jobs = get_bridge().jobs([JobState(s) for s in a.state], limit=a.limit)
    print(render.jobs_table(jobs))


def _job_command(name: str, argv: list[str]) -> str:
    p = _parser(name)
    p.add_argument("job", help="job id (or a unique prefix)")
    job_id: str = p.parse_args(argv).job
    return job_id


def _logs(argv: list[str], ns: dict[str, Any]) -> None:
    job_id = _job_command("logs", argv)
    text = render.logs(get_bridge().all_logs(job_id))
    print(text or "(no log lines)")


def _show(argv: list[str], ns: dict[str, Any]) -> None:
    print(render.summary(get_bridge().get(_job_command("show", argv))))


def _explain(argv: list[str], ns: dict[str, Any]) -> None:
    print(plain(get_bridge().explain(_job_command("explain", argv))))


def _cancel(argv: list[str], ns: dict[str, Any]) -> None:
    bridge = get_bridge()
    job = bridge.cancel(_job_command("cancel", argv))
    if not job.state.terminal:
        job = bridge.wait(job.id, timeout=30.0)
    print(render.state_line(job))


def _connect(argv: list[str], ns: dict[str, Any]) -> None:
    p = _parser("connect")
    p.add_argument("url", help="the control plane, e.g. https://gpu-box:8800")
    p.add_argument("--token", default=None, help="a client token (asked for when omitted)")
    a = p.parse_args(argv)
    token = a.token
    if token is None:
        try:
            token = getpass.getpass(f"GPUlayer token for {a.url}: ")
        except StdinNotImplementedError:
            raise CellError(
                "this frontend cannot ask for the token",
                hint="pass it: %gpulayer connect URL --token TOKEN",
            ) from None
    bridge = reconnect(Target(url=a.url, token=token))
    workers = bridge.workers()  # fails here, clearly, when the URL or token is wrong
    print(f"connected to the {bridge.describe()} ({count(len(workers), 'worker')})")


def _local(argv: list[str], ns: dict[str, Any]) -> None:
    p = _parser("local")
    p.add_argument("--home", default=None, help="state folder (default $GPULAYER_HOME)")
    p.add_argument("--simulate-gpus", type=int, default=None, metavar="N")
    p.add_argument("--simulate-kind", default=None, metavar="KIND", help="e.g. a100-80gb")
    a = p.parse_args(argv)
    bridge = reconnect(
        Target(
            local=True,
            home=a.home,
            simulate_gpus=a.simulate_gpus,
            simulate_kind=a.simulate_kind,
        )
    )
    workers = bridge.workers()
    print(f"using the {bridge.describe()}")
    print(render.workers_table(workers))


def _session(argv: list[str], ns: dict[str, Any]) -> None:
    session_command(argv, ns, widget=display_mode() == "widget")


def _push(argv: list[str], ns: dict[str, Any]) -> None:
    push_command(argv, ns)


def _pull(argv: list[str], ns: dict[str, Any]) -> None:
    from ..workspace.pulls import is_file_name

    words = [w for w in argv if not w.startswith("-")]
    if "--file" in argv or (words and is_file_name(words[0])):
        _pull_files([w for w in argv if w != "--file"])
    else:
        pull_command(argv, ns)


def _pull_files(argv: list[str]) -> None:
    """``%gpulayer pull PATH...``: files left on the worker (over the cap) into the folder."""
    import os
    import sys

    from ..client.workspace import link_for
    from ..workspace.pulls import (
        MODE_ENV,
        ask_from_inside,
        left_by_cells,
        progress_line,
        pull_after_cells,
        pull_files,
    )
    from .bridge import get_bridge
    from .sessions.cells import workspace_of
    from .sessions.current import kernel_sessions

    p = _parser("pull")
    p.add_argument("paths", nargs="+", help="files in the workspace, as the cell's note lists")
    p.add_argument("--session", default=None, help="default: the kernel's current session")
    a = p.parse_args(argv)
    if os.environ.get(MODE_ENV):  # a GPU kernel, on its worker
        print(ask_from_inside(a.paths))
        return
    sessions = kernel_sessions()
    if a.session is None and sessions.current is None and left_by_cells():  # one-shot cells'
        print(pull_after_cells(get_bridge(), a.paths))
        return
    handle = sessions.handle(a.session)
    hooks = workspace_of(handle)
    engine = getattr(hooks, "engine", None)
    show = progress_line(sys.stdout)
    said = handle.bridge.call(
        lambda s: pull_files(link_for(s), handle.id, a.paths, show, engine=engine)
    )
    print(said)


def _display(argv: list[str], ns: dict[str, Any]) -> None:
    p = _parser("display")
    p.add_argument("mode", choices=DISPLAY_MODES)
    mode = p.parse_args(argv).mode
    if mode == "widget":
        try:
            import anywidget  # noqa: F401
        except ImportError as exc:
            err = MissingExtra.of("jupyter", "%gpulayer display widget", exc)
            raise UsageError(f"{err.message}\n{err.hint}") from None
    set_display_mode(mode)
    print(f"display: {display_mode()}")


COMMANDS: dict[str, Callable[[list[str], dict[str, Any]], Any]] = {
    "status": _status,
    "workers": _workers,
    "jobs": _jobs,
    "logs": _logs,
    "show": _show,
    "explain": _explain,
    "cancel": _cancel,
    "connect": _connect,
    "local": _local,
    "display": _display,
    "session": _session,
    "push": _push,
    "pull": _pull,
}

HELP = """\
%gpulayer COMMAND
  status                      where jobs go, workers, GPUs and job counts (the default)
  workers                     workers and their devices
  jobs [--state S] [--limit N] recent jobs
  logs JOB                    a job's log so far
  show JOB                    a job's state, placement, progress, result and artifacts
  explain JOB                 why a job waits, or why it went where it went
  cancel JOB                  cancel a job and wait until its processes are stopped
  connect URL [--token T]     use a served control plane (asks for the token if omitted)
  local [--home DIR] [--simulate-gpus N] [--simulate-kind KIND]
                              use an embedded control plane in this kernel
  display auto|widget|text    how %%gpulayer cells show jobs
  session start [--gpus N] [--nodes M] [--gpu-kind K] [--fallback cpu] [--idle-timeout 30m]
          [--name NAME]       a GPU that keeps state: the %%gpulayer cells below run in it
  session list [--all]        sessions (* marks this kernel's current one)
  session show [NAME]         a session and its last cells
  session stop|restart|interrupt [NAME]
                              end it (GPUs freed), start its ranks again, or interrupt its cell
  session attach NAME         take a session over (a restarted kernel gets its session back)
  push x,y [--session S]      send kernel variables into the session (tensors: safetensors)
  pull x,y [--session S]      bring session variables (rank 0's) into the kernel
  pull PATH... [--file]       bring files left on the worker (over the size cap) into the
                              notebook's folder (a name with . or /, or --file, is a file)
Run a cell as a job with %%gpulayer; see its options with %%gpulayer --help."""
