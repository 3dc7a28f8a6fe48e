"""What a ``%%gpulayer`` cell becomes before it is submitted: its bundle, env, labels, errors.

The magic (``magics.py``) parses the line and calls these: the cell source (+ ``--files``) as a
content-addressed bundle, ``--env`` values (``NAME`` alone passes the kernel's value, as
``gpulayer run`` does), the notebook label the JupyterLab panel's Notebook button opens, and the
words of the errors a cell shows for bad input.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import bundles
from ..contracts import ensure_json
from ..errors import GPUlayerError, InvalidInput, NotJSON
from ..jobenv import env_option
from .handle import CellError

CELL_FILE = "cell.py"
# Line 1 of cell.py stands for the %%gpulayer line, so traceback line numbers match the cell.
CELL_HEADER = "# %%gpulayer cell (this line stands for the magic line)\n"
# The job label naming the notebook that submitted it (the panel's Notebook button reads it).
NOTEBOOK_LABEL = "gpulayer.io/notebook"

IN_ACCEPTS = "--in sends plain JSON values: numbers, strings, booleans, None, and lists or dicts"
IN_HINT = (
    f"{IN_ACCEPTS} of them. For a tensor or an array, send a list (x.tolist()) when it is small, "
    "or save it to a file (torch.save, numpy.save) and send the file with --files PATH; a job's "
    "own files come back as artifacts"
)
IN_CODE_HINT = (
    f"{IN_ACCEPTS} of them, not code. Define the function or class inside the cell, or put it in "
    "a .py file, send it with --files PATH and import it there"
)
IN_OTHER_HINT = (
    f"{IN_ACCEPTS} of them. Convert the value to those, or save it to a file and send the file "
    "with --files PATH"
)

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


def in_hint(value: Any) -> str:
    """What to do instead, for an ``--in`` value that is not JSON (a tensor, a lambda, …)."""
    if hasattr(value, "tolist") or hasattr(value, "__array__"):
        return IN_HINT
    if callable(value) or isinstance(value, type(os)):
        return IN_CODE_HINT
    return IN_OTHER_HINT


def cell_inputs(ns: Mapping[str, Any], specs: list[str]) -> dict[str, Any]:
    """The ``--in a,b`` kernel variables as the job's JSON arguments, checked and named."""
    names = [n.strip() for s in specs for n in s.split(",") if n.strip()]
    out: dict[str, Any] = {}
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
        except NotJSON as exc:
            raise CellError(
                exc.message, hint=in_hint(ns[name]), details=exc.details, code=exc.code
            ) from None
        # Tuples become lists here, as they would on the wire.
        out[name] = json.loads(json.dumps(ns[name]))
    return out


def env_values(values: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``--env`` as a dict (``NAME`` alone: the kernel's value); bad items are the cell's error."""
    try:
        return env_option(values, "--env", environ)
    except InvalidInput as exc:
        raise CellError(exc.message, hint=exc.hint, details=exc.details) from None


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


def bundle(cell: str, files: list[str]) -> tuple[str, bytes]:
    """The cell (+ files) as a content-addressed bundle: same source, same digest."""
    source = (CELL_HEADER + cell).encode()
    digest, data = bundles.build_from_paths(
        [Path(f) for f in files], Path.cwd(), extra={CELL_FILE: source}
    )
    if files and bundles.read_files(data).get(CELL_FILE) != source:
        raise CellError(
            f"--files: a file named {CELL_FILE} would replace the cell's own source",
            hint=f"rename it; {CELL_FILE} at the top of the bundle is the cell",
        )
    return digest, data
