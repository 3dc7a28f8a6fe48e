"""What a ``%%gpulayer`` cell becomes before it is submitted: its bundle, inputs, labels, errors.

The magic (``magics.py``) parses the line and calls these: the cell source (+ ``--files``) as a
content-addressed bundle, the ``--in`` values, the notebook label the JupyterLab panel's Notebook
button opens, and the words of the errors a cell shows for bad input. The job options
(``--gpus``, ``--env``...) are ``jobopts.py``'s, as at every edge.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import bundles, transfer
from ..contracts import ensure_json
from ..errors import GPUlayerError, NotJSON, TooLarge
from .handle import CellError

CELL_FILE = "cell.py"
# Line 1 of cell.py stands for the %%gpulayer line, so traceback line numbers match the cell.
CELL_HEADER = "# %%gpulayer cell (this line stands for the magic line)\n"
# The job label naming the notebook that submitted it (the panel's Notebook button reads it).
NOTEBOOK_LABEL = "gpulayer.io/notebook"

# JobSpec fields named by a validation error, and the option the user typed.
OPTION_OF = {
    "resources.gpus": "--gpus",
    "resources.nodes": "--nodes",
    "resources.gpu_kind": "--gpu-kind",
    "resources.worker": "--worker",
    "timeout": "--timeout",
    "retries": "--retries",
    "env": "--env",
    "secrets": "--secret",
    "name": "--name",
}


def cell_error(exc: GPUlayerError) -> CellError:
    """A GPUlayer error, shown in the cell as its message and hint (no internal traceback)."""
    message = exc.message
    for field, option in OPTION_OF.items():
        message = message.replace(f"JobSpec: {field}:", f"{option}:")
    return CellError(message, hint=exc.hint, details=exc.details, code=exc.code)


def cell_inputs(ns: Mapping[str, Any], specs: list[str]) -> tuple[dict[str, Any], bytes | None]:
    """The ``--in a,b`` kernel variables, checked and named: the JSON ones as the job's
    arguments, the others (tensors, arrays, dicts of them) as one tensor-safe file for the
    bundle (``transfer.CELL_INPUTS``); anything else is the cell's error."""
    names = [n.strip() for s in specs for n in s.split(",") if n.strip()]
    out: dict[str, Any] = {}
    moved: dict[str, Any] = {}
    for name in names:
        if not name.isidentifier():
            raise CellError(f"--in {name!r} is not a variable name", hint="write --in a,b")
        if name not in ns:
            raise CellError(
                f"--in {name}: there is no variable {name!r} in the kernel",
                hint="define it in a cell above first",
            )
        try:
            ensure_json(ns[name], f"--in {name}")
        except NotJSON:
            moved[name] = ns[name]
            continue
        # Tuples become lists here, as they would on the wire.
        out[name] = json.loads(json.dumps(ns[name]))
    if not moved:
        return out, None
    # The file rides in the bundle, so the bundle's limit is its limit too.
    limit = min(transfer.max_bytes(), bundles.MAX_BUNDLE_BYTES // 2)
    try:
        return out, transfer.encode(moved, limit, across="to a job")
    except (NotJSON, TooLarge) as exc:
        raise CellError(
            f"--in {exc.message}", hint=exc.hint, details=exc.details, code=exc.code
        ) from None


def notebook_path(user_ns: Mapping[str, Any]) -> str | None:
    """The notebook this kernel runs for, as its Jupyter server named it; None when unknown.

    A kernel a Jupyter server started for a notebook has ``JPY_SESSION_NAME`` (ipykernel also
    copies it to ``__session__``); VS Code sets ``__vsc_ipynb_file__``. A plain IPython, nbval
    or nbconvert has none of them, and the job simply carries no notebook label.
    """
    for candidate in (
        os.environ.get("JPY_SESSION_NAME"),
        user_ns.get("__session__"),
        user_ns.get("__vsc_ipynb_file__"),
    ):
        if isinstance(candidate, str) and candidate.strip() and "\x00" not in candidate:
            return candidate
    return None


def check_syntax(cell: str) -> None:
    """Refuse a cell that cannot compile before anything is submitted, with the cell's line."""
    try:
        ast.parse(CELL_HEADER + cell, filename=CELL_FILE)
    except SyntaxError as exc:
        raise CellError(
            f"line {exc.lineno} of the cell: {exc.msg}",
            hint="a %%gpulayer cell runs as plain Python on the worker (no ! or % lines)",
            code="cell_syntax",
        ) from None


# Names IPython puts in every kernel's namespace; a cell that reads them means something else.
_KERNEL_ONLY = frozenset({"In", "Out", "get_ipython", "exit", "quit"})


def check_kernel_names(cell: str, ns: Mapping[str, Any], inputs: list[str]) -> None:
    """Refuse a one-shot cell that reads names defined only in the kernel (issue 36).

    The job runs in a fresh namespace on the worker, so such a name is a ``NameError`` there,
    on every rank, after the job started. A name counts as the cell's own when the cell binds it
    anywhere (assignment, def, class, import, parameter, loop, with, except, match), when
    ``--in`` sends it, or when it is a builtin; a ``from m import *`` turns the check off.
    """
    tree = ast.parse(CELL_HEADER + cell, filename=CELL_FILE)
    bound = {n.strip() for spec in inputs for n in spec.split(",")} | set(dir(builtins))
    read: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                read.setdefault(node.id, node.lineno - 1)  # line 1 is the magic's line
            else:
                bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return  # what a star import binds is unknown here
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    missing = [n for n in read if n not in bound and n in ns and n not in _KERNEL_ONLY]
    if not missing:
        return
    name = missing[0]
    what = "module" if inspect.ismodule(ns[name]) else type(ns[name]).__name__
    others = f" (also: {', '.join(missing[1:4])})" if len(missing) > 1 else ""
    value = "" if what in ("function", "module", "type") else f"; a value can travel: --in {name}"
    raise CellError(
        f"line {read[name]} of the cell uses {name!r} ({what}), which is defined in the kernel, "
        f"not in the cell{others}: the cell runs in a fresh namespace on the worker",
        hint="defined in the kernel: define it in the cell, or send its module with --files "
        f"and import it there{value}",
        details={"names": missing},
        code="cell_name_undefined",
    )


def bundle(cell: str, files: list[str], inputs: bytes | None = None) -> tuple[str, bytes]:
    """The cell (+ files, + the ``--in`` values JSON cannot carry) as a content-addressed
    bundle: same source, same digest."""
    source = (CELL_HEADER + cell).encode()
    extra = {CELL_FILE: source}
    what = {CELL_FILE: "source", transfer.CELL_INPUTS: "--in values"}
    if inputs is not None:
        extra[transfer.CELL_INPUTS] = inputs
    digest, data = bundles.build_from_paths([Path(f) for f in files], Path.cwd(), extra=extra)
    if files:
        inside = bundles.read_files(data)
        for name, content in extra.items():
            if inside.get(name) != content:
                raise CellError(
                    f"--files: a file named {name} would replace the cell's own {what[name]}",
                    hint=f"rename it; {name} at the top of the bundle is GPUlayer's",
                )
    return digest, data
