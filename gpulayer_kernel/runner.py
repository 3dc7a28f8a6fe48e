"""Runs a Python workload inside a job: ``python -m gpulayer_kernel.runner ENTRYPOINT``.

Modes by entrypoint shape: ``pkg.mod:func`` (called with the job's JSON args; its return value is
the result), ``script.py`` (run as ``__main__``), ``cell:cell.py`` (a notebook cell: the ``--in``
values are bound as variables, and the value of the last expression is the result). The result is
JSON or the job fails with an error that says so; nothing is pickled.
"""

from __future__ import annotations

import ast
import importlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from . import job
from .errors import NotJSON


def run_cell(path: Path, namespace: dict[str, Any]) -> tuple[bool, Any]:
    """Execute a cell file; return (has_value, value of the last expression)."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    last: ast.expr | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop().value  # type: ignore[attr-defined]
    # Compiled with the cell's own file name so tracebacks point at lines of the cell.
    exec(compile(tree, str(path), "exec"), namespace)  # noqa: S102 - running user code is the job
    if last is None:
        return False, None
    expr = ast.Expression(body=last)
    return True, eval(compile(expr, str(path), "eval"), namespace)  # noqa: S307


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpulayer_kernel.runner ENTRYPOINT", file=sys.stderr)
        return 2
    entry = argv[0]
    sys.path.insert(0, os.getcwd())
    args = job.args()
    value: Any = None
    has_value = False
    try:
        if entry.startswith("cell:"):
            namespace: dict[str, Any] = {"__name__": "__main__", **args}
            has_value, value = run_cell(Path(entry.removeprefix("cell:")), namespace)
        elif entry.endswith(".py"):
            sys.argv = [entry]
            runpy.run_path(entry, run_name="__main__")
        else:
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
        return 1
    explicit, explicit_value = job.result_was_set()
    if explicit:
        return 0
    if has_value and value is not None:
        try:
            job.result(value)
        except NotJSON as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


_HERE = str(Path(__file__).resolve().parent)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
