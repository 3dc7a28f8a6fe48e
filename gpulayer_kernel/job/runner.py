"""Runs a Python workload inside a job: ``python -m gpulayer_kernel.job.runner ENTRYPOINT``.

Modes by entrypoint shape: ``pkg.mod:func`` (called with the job's JSON args; its return value is
the result), ``script.py`` (run as ``__main__``), ``cell:cell.py`` (a notebook cell: the ``--in``
values are bound as variables, and the value of the last expression is the result), and
``session:`` (a rank of a session: ``worker/sessions/host.py``). The result is
JSON or the job fails with an error that says so; nothing is pickled.

Start-up cost matters here: every cell pays it. This module imports nothing heavy on the common
path (pydantic alone costs ~90 ms); a result that is plain JSON is written without loading the
contracts, and only a value that needs a precise error message loads ``ensure_json``.
"""

from __future__ import annotations

import ast
import faulthandler
import json
import linecache
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import job, transfer
from ..errors import NotJSON, TooLarge

if TYPE_CHECKING:
    from ..contracts.results import ShownValue

SESSION_ENTRYPOINT = "session:"
# The job's own files (its cell, its --in values, --files) when it runs in the notebook's folder
# (a workspace, ADR 0022) rather than among them: read from here, never written into the folder.
BUNDLE_ENV = "GPULAYER_BUNDLE_DIR"
# ensure_json's size limit (contracts._base.MAX_JSON_BYTES); bigger values take the slow path.
_FAST_JSON_BYTES = 1 << 20


def run_cell(path: Path, namespace: dict[str, Any], source: str | None = None) -> tuple[bool, Any]:
    """Execute a cell file; return (has_value, value of the last expression).

    ``source``: the cell's text held in memory (the warm runner's cells skip the file); its
    lines are registered for tracebacks as the file's would be read."""
    if source is None:
        source = path.read_text()
    else:
        linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))
    tree = ast.parse(source, filename=str(path))
    last: ast.expr | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop().value  # type: ignore[attr-defined]
    # Compiled with the cell's own file name so tracebacks point at lines of the cell.
    exec(compile(tree, str(path), "exec"), namespace)
    if last is None:
        return False, None
    expr = ast.Expression(body=last)
    return True, eval(compile(expr, str(path), "eval"), namespace)


def main(argv: list[str], sources: Mapping[str, str] | None = None) -> int:
    """``python -m gpulayer_kernel.job.runner ENTRYPOINT``; ``sources``: files (by their path in the
    bundle) given in memory rather than read from the working directory (a cell's text)."""
    if len(argv) != 1:
        print("usage: python -m gpulayer_kernel.job.runner ENTRYPOINT", file=sys.stderr)
        return 2
    # A native crash (a segfault, C++'s std::terminate raising SIGABRT) prints each thread's
    # Python stack to the job's log: where it happened, not only the signal.
    faulthandler.enable()
    entry = argv[0]
    if entry == SESSION_ENTRYPOINT:
        # A rank of a session (ADR 0019): IPython's shell, served over stdin's socket.
        from ..worker.sessions import host as session_host

        return session_host.main()
    sys.path.insert(0, os.getcwd())
    bundle = os.environ.get(BUNDLE_ENV) or None
    if bundle is not None:
        sys.path.insert(1, bundle)  # the notebook's modules first, then the job's own
    args = job.args()
    value: Any = None
    has_value = False
    try:
        if entry.startswith("cell:"):
            namespace: dict[str, Any] = {"__name__": "__main__", **args}
            namespace.update(_moved_inputs(bundle))
            name = entry.removeprefix("cell:")
            source = sources.get(name) if sources else None
            if source is None and bundle is not None:
                source = Path(bundle, name).read_text()
            has_value, value = run_cell(Path(name), namespace, source)
        elif entry.endswith(".py"):
            import runpy

            script = os.path.join(bundle, entry) if bundle is not None else entry
            sys.argv = [script]
            runpy.run_path(script, run_name="__main__")
        else:
            import importlib

            module, _, func = entry.partition(":")
            value = getattr(importlib.import_module(module), func)(**args)
            has_value = True
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        # The traceback goes to the job's log; its frames name the user's files and lines.
        etype, evalue, tb = sys.exc_info()
        frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_HERE)]
        print("Traceback (most recent call last):", file=sys.stderr)
        print("".join(traceback.format_list(frames)), end="", file=sys.stderr)
        print("".join(traceback.format_exception_only(etype, evalue)), end="", file=sys.stderr)
        note = job.simulated_note(str(evalue))
        if note:
            print(note, file=sys.stderr)
        return 1
    explicit, _ = job.result_was_set()
    if explicit:
        return 0
    if has_value and value is not None:
        cell = entry.startswith("cell:")
        what = "the cell's last expression" if cell else "the return value"
        try:
            if not _plain_json(value):
                from ..contracts import ensure_json  # the slow path: an exact error message

                ensure_json(value, what)
            job.write_result(value)
        except (NotJSON, ValueError) as exc:
            if cell:
                # As in Jupyter, a cell's last value is shown, whatever it is; its work is done,
                # so a value JSON cannot carry is sent as its display, not made a failure.
                from ..contracts.results import CellResult

                shown = shown_value(value, str(exc)).model_copy(update=_moved_value(value))
                job.write_result(CellResult(shown=shown).to_wire())
                return 0
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


LAST_VALUE = "the cell's last value"  # its name in the --out artifact (and in its errors)
MAX_SHOWN = 20_000
# A one-shot cell's displayed value travels in its result, which the API takes up to 1 MiB.
MAX_SHOWN_DISPLAY = 768 << 10


def shown_value(value: Any, why: str) -> ShownValue:
    """How a cell's last value is shown in the notebook (never for ``--out``): its MIME bundle,
    made as a session cell's is (``display.format_value``: ``_repr_html_``, ``_repr_png_``…,
    and ``repr`` as text/plain), and the text form alone for the shortest readers."""
    from .. import display  # the slow path only: a value JSON could not carry
    from ..contracts.results import ShownValue

    shown = display.format_value(value)
    shown = display.bound(shown, min(MAX_SHOWN_DISPLAY, display.max_bytes()))
    text = display.text_of(shown)
    if len(text) > MAX_SHOWN:
        text = text[:MAX_SHOWN] + f"… ({len(text) - MAX_SHOWN} more characters)"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return ShownValue(text=text, type=kind, why=why, display=shown)


def _moved_inputs(bundle: str | None = None) -> dict[str, Any]:
    """The ``--in`` values JSON could not carry (tensors, arrays), from the cell's bundle."""
    path = Path(bundle or "", transfer.CELL_INPUTS)
    if not path.is_file():
        return {}
    return transfer.decode(path.read_bytes())


def _moved_value(value: Any) -> dict[str, Any]:
    """With ``--out`` (``OUT_ENV``): a last value JSON cannot carry, as a tensor-safe artifact
    the kernel assigns; or why it cannot be (the magic says so and shows the value)."""
    if not os.environ.get(transfer.OUT_ENV) or os.environ.get("RANK", "0") != "0":
        return {}  # (only rank 0's value is the result)
    try:
        data = transfer.encode({LAST_VALUE: value}, across="from a job to the kernel")
    except (NotJSON, TooLarge) as exc:
        return {"refused": exc.message, "refused_hint": exc.hint}
    (job.output_dir() / transfer.CELL_VALUE).write_bytes(data)
    return {"artifact": transfer.CELL_VALUE}


def _plain_json(value: Any) -> bool:
    """True when ``value`` is certainly JSON that ``ensure_json`` accepts (a fast, strict check).

    False means "not sure", never "refused": the caller then asks ``ensure_json``, which owns the
    rules and names the offending item.
    """
    if not transfer.is_plain_json(value):
        return False
    try:
        return len(json.dumps(value, allow_nan=False)) <= _FAST_JSON_BYTES
    except (TypeError, ValueError):
        return False


# GPUlayer's own frames (this package, the worker's fork server) are not the user's: filtered.
_HERE = str(Path(__file__).resolve().parents[1])

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
