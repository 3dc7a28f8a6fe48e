"""One rank of a session: IPython's own ``InteractiveShell``, driven by its worker (ADR 0019).

This runs in a process forked from the worker's session warm runner (IPython and, where the
worker has it, torch already imported; CUDA never initialised there), started with
``session:`` as its entrypoint. Its stdin is a UNIX stream socket to the worker's
:class:`~gpulayer_kernel.worker.sessions.executor.SessionExecutor` (moved off fd 0 at once:
the cell's ``input()`` reads ``/dev/null``); stdout and stderr stay the job's pipes, so what C
code and subprocesses write at the file-descriptor level still reaches the log.

A cell runs as in a local kernel, because it *is* IPython's shell: state is kept between cells;
the last expression goes through IPython's display formatter (``Out[n]``); ``display()``,
``print``, stderr and warnings are captured in order; matplotlib figures come through the inline
backend (``MPLBACKEND`` is set as ipykernel sets it); tracebacks are IPython's, and their line
numbers point into the cell (``Cell In[n], line l`` with the notebook's own ``n``). Everything
goes back as JSON: display data as MIME bundles (bounded by :mod:`gpulayer_kernel.display`).

Frames on the socket are a 4-byte big-endian length and a JSON object. The worker sends
``{"op": "run", ...}`` or ``{"op": "exit"}``; this process answers ``{"ready": ...}`` once (or
``{"fatal": ...}``), and per cell ``{"out": n, "items": [...]}`` while it runs long (every
``FLUSH_EVERY`` s) and ``{"done": n, ...}`` at its end, which carries what is left: a short
cell is one frame each way. Only the sender thread writes the socket, so a KeyboardInterrupt in
the main thread (the worker's interrupt: SIGINT) can never cut a frame in two; SIGINT outside a
cell is ignored (``SIG_IGN``), inside one it is Python's own handler.

With ``WORLD_SIZE`` > 1 the ranks join one ``torch.distributed`` process group before they say
ready (static rendezvous: ``MASTER_ADDR``/``MASTER_PORT`` from the worker), once for the
session's life.

The socket, its sender thread and the cell's output streams (capped as the worker asks) are in
``channel.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import display, transfer
from ...errors import MissingExtra
from ...job import simulated_note
from .channel import Channel, OutStream
from .wire import recv_frame

# What a collective raises when a peer went away: the process group is then broken.
BROKEN_GROUP = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "DistBackendError",
    "DistNetworkError",
    "ProcessGroupGloo",
)


def make_shell(channel: Channel) -> Any:
    """IPython's InteractiveShell, with its display going to ``channel`` instead of a terminal."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class CellDisplayHook(DisplayHook):
        """The cell's last value (Out[n]): kept as display content, nothing printed."""

        value: dict[str, Any] | None = None

        def start_displayhook(self) -> None:
            pass

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: Any, md_dict: Any = None) -> None:
            self.value = display.bound(display.content(format_dict, md_dict))

        def finish_displayhook(self) -> None:
            self._is_active = False

    class CellDisplayPublisher(DisplayPublisher):
        """``display()``, figures, ``clear_output``: items of the running cell's output."""

        def publish(
            self,
            data: Any,
            metadata: Any = None,
            source: Any = None,
            *,
            transient: Any = None,
            update: bool = False,
            **kwargs: Any,
        ) -> None:
            item = display.content(data, metadata, transient=transient, update=update)
            channel.items.append(["display", display.bound(item)])

        def clear_output(self, wait: bool = False) -> None:
            channel.items.append(["display", display.content({display.CLEAR: {"wait": wait}})])

    class SessionShell(InteractiveShell):
        error: dict[str, Any] | None = None

        def showtraceback(self, *args: Any, **kwargs: Any) -> None:
            # A second interrupt while IPython formats the first one's traceback (pygments is
            # slow) would raise inside the formatter and replace the cell's traceback with its
            # own frames: the cell is ending anyway, so interrupts wait until it is shown.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                super().showtraceback(*args, **kwargs)
            finally:
                signal.signal(signal.SIGINT, previous)

        def _showtraceback(self, etype: Any, evalue: Any, stb: list[str]) -> None:
            stb = [str(s) for s in stb]
            note = simulated_note(str(evalue))
            if note:
                stb.append(note)
            self.error = {
                "ename": getattr(etype, "__name__", str(etype)),
                "evalue": str(evalue)[:20_000],
                "traceback": stb[-2_000:],
            }

    config = Config()
    config.HistoryManager.enabled = False  # no SQLite history file per session process
    config.InteractiveShell.colors = "linux"  # ANSI colours, which notebooks render
    return SessionShell.instance(
        config=config,
        displayhook_class=CellDisplayHook,
        display_pub_class=CellDisplayPublisher,
        user_ns={"__name__": "__main__"},
    )


class Host:
    """The rank's loop: receive a request, run it in the shell, answer."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = Channel(sock)
        self.sock = sock
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.shell: Any = None

    def start(self) -> None:
        # Outside a cell (while starting, between cells) an interrupt has nothing to stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        self.shell = make_shell(self.channel)
        sys.stdout = OutStream("stdout", self.channel, 1)
        sys.stderr = OutStream("stderr", self.channel, 2)
        versions: dict[str, Any] = {"python": sys.version.split()[0]}
        if self.world_size > 1:
            from ...job.ranks import init_distributed

            init_distributed()
        if "torch" in sys.modules:
            versions["torch"] = sys.modules["torch"].__version__
        self.channel.send(
            {"ready": os.getpid(), "rank": self.rank, "world_size": self.world_size, **versions}
        )

    def serve(self) -> None:
        while True:
            try:
                request = recv_frame(self.sock)
            except KeyboardInterrupt:  # pragma: no cover - the handler raises only in a cell
                continue
            if request is None or request.get("op") == "exit":
                return
            if request.get("op") == "run":
                try:
                    done = self.run(request)
                    # Already ignored when ``run`` returns, unless an interrupt cut its
                    # ``finally`` short: the done frame goes from this thread, never cut in half.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                except KeyboardInterrupt:
                    # An interrupt that landed just after the cell's end: it stopped nothing.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    done = self._done(request, {"status": "ok"}, 0.0)
                self.channel.send_now(done)

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        shell = self.shell
        n = int(request["n"])
        hook = shell.displayhook
        hook.value = None
        shell.error = None
        cap = request.get("cap")
        self.channel.start_cell(n, (int(cap[0]), int(cap[1])) if cap else None)
        started = time.monotonic()
        broken: str | None = None
        last: Any = None  # the value of the cell's last expression (what Out[n] shows)
        try:
            self._bind(request)
            if request.get("count") is not None:
                shell.execution_count = int(request["count"])
            # Python's own handler (in C: no frame of ours in the cell's traceback) while the
            # cell runs; ignored again the moment it ends.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                ran = shell.run_cell(
                    request.get("code", ""), store_history=bool(request["history"])
                )
                last = ran.result
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        except KeyboardInterrupt:
            shell.error = {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
        except Exception as exc:  # our own binding step (a bad inputs file): the cell's error
            shell.error = _error_of(exc)
        duration = time.monotonic() - started
        error = shell.error
        if error is not None and self.world_size > 1 and _breaks_group(error):
            broken = (
                f"rank {self.rank}: {error['ename']}: {error['evalue']}"[:500]
                + " (the process group is broken)"
            )
        outcome: dict[str, Any] = {
            "status": "error" if error is not None else "ok",
            "error": error,
            "value": hook.value if request.get("value", True) else None,
            "broken": broken,
        }
        if request.get("outputs") and error is None:
            outcome.update(self._outputs(request, last))
        return self._done(request, outcome, duration)

    def _done(
        self, request: dict[str, Any], outcome: dict[str, Any], duration: float
    ) -> dict[str, Any]:
        items = self.channel.end_cell()
        done = {"done": int(request["n"]), "duration": duration, "items": items, **outcome}
        if self.channel.dropped[1]:
            done["dropped"] = list(self.channel.dropped)
        return done

    def _bind(self, request: dict[str, Any]) -> None:
        """Put the cell's inputs in the namespace (``--in``, push): JSON, then a transfer file."""
        ns = self.shell.user_ns
        ns.update(request.get("inputs") or {})
        path = request.get("inputs_path")
        if path:
            ns.update(transfer.decode(Path(path).read_bytes()))

    def _outputs(self, request: dict[str, Any], last: Any) -> dict[str, Any]:
        """What ``--out``/pull asked for: as JSON, or a transfer file, or why not. A cell's
        ``--out NAME`` is its last value, as for a one-shot cell, or without one the session's
        variable ``NAME``; pull (a cell with no code) takes variables."""
        ns = self.shell.user_ns
        names: list[str] = list(request["outputs"])
        if len(names) == 1 and last is not None:
            values = {names[0]: last}
        else:
            missing = [n for n in names if n not in ns]
            if missing:
                why = "the cell has no value and " if request.get("code", "").strip() else ""
                return {"outputs_error": f"{why}the session has no variable {', '.join(missing)}"}
            values = {n: ns[n] for n in names}
        if all(transfer.is_plain_json(v) for v in values.values()):
            try:
                json.dumps(values, allow_nan=False)
                return {"outputs": values}
            except ValueError:
                pass
        try:
            data = transfer.encode(values)
        except Exception as exc:
            return {"outputs_error": getattr(exc, "message", str(exc))}
        path = Path(request["outputs_path"])
        path.write_bytes(data)
        return {"outputs_path": str(path)}


def _error_of(exc: BaseException) -> dict[str, Any]:
    return {
        "ename": type(exc).__name__,
        "evalue": str(exc)[:20_000],
        "traceback": traceback.format_exception(exc)[-50:],
    }


def _breaks_group(error: dict[str, Any]) -> bool:
    text = f"{error.get('ename')}: {error.get('evalue')}"
    return any(marker in text for marker in BROKEN_GROUP)


def main(open_socket: Callable[[], socket.socket] | None = None) -> int:
    """The rank process's body (``runner`` calls it for the ``session:`` entrypoint)."""
    sock = open_socket() if open_socket is not None else _socket_from_stdin()
    host = Host(sock)
    try:
        host.start()
    except BaseException as exc:
        if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "IPython":
            # A worker installed without the jupyter extra: say what to install, where.
            exc = MissingExtra.of("jupyter", "a session on this worker", exc)
        host.channel.send({"fatal": f"{type(exc).__name__}: {exc}", **_error_of(exc)})
        _drain(host.channel)
        return 1
    try:
        host.serve()
    finally:
        _drain(host.channel)
    return 0


def _socket_from_stdin() -> socket.socket:
    """The worker's socket, passed as fd 0: moved off it, and fd 0 becomes /dev/null."""
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    return sock


def _drain(channel: Channel, timeout: float = 5.0) -> None:
    """Let the sender thread write what is queued before the process exits."""
    deadline = time.monotonic() + timeout
    while channel._out and time.monotonic() < deadline:
        channel._wake.set()
        time.sleep(0.001)
