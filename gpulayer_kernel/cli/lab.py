"""``gpulayer lab``: start JupyterLab (its server extension hosts the control plane).

Every option but ``--help`` is JupyterLab's and passes through as written (``main`` parses this
command with ``parse_known_args``): ``gpulayer lab --no-browser --port 8899``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import GPUlayerError, MissingExtra
from .common import Handler

COMMAND = "lab"
QUICKSTART = Path("notebooks/01-quickstart.ipynb")


def add_parsers(sub: Any) -> None:
    """Add lab to the ``gpulayer`` sub-parsers."""
    sub.add_parser(
        COMMAND,
        help="start JupyterLab with GPUlayer on the embedded default, at the quickstart",
        usage="gpulayer lab [-h] [NOTEBOOK] [JUPYTERLAB OPTIONS...]",
        description="Start JupyterLab; its GPUlayer server extension hosts the control plane.\n"
        "Opens NOTEBOOK, or the quickstart notebook when run from a GPUlayer checkout.",
        epilog="Every other option goes to JupyterLab as written, e.g.\n"
        "  gpulayer lab --no-browser --port 8899\n"
        "(see `jupyter lab --help`; after `--`, even --help is JupyterLab's).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --he must reach JupyterLab, not expand to our --help
    )


def lab_argv(extra: list[str], *, root: bool, quickstart: Path = QUICKSTART) -> list[str]:
    """The ``python -m jupyterlab`` command line for ``gpulayer lab`` followed by ``extra``."""
    passed = extra[1:] if extra[:1] == ["--"] else list(extra)
    argv = [sys.executable, "-m", "jupyterlab"]
    opens_a_file = any(
        not a.startswith("-") and (a.endswith(".ipynb") or Path(a).exists()) for a in passed
    )
    if not opens_a_file and quickstart.exists():
        argv.append(str(quickstart))
    if root and "--allow-root" not in passed:
        argv.append("--allow-root")  # JupyterLab refuses root without it (containers, CI)
    return argv + passed


async def cmd_lab(args: argparse.Namespace) -> int:
    """Replace this process with ``jupyter lab`` (the server extension hosts the control plane)."""
    if importlib.util.find_spec("jupyterlab") is None:
        raise MissingExtra.of("jupyter", "gpulayer lab", ImportError(name="jupyterlab"))
    argv = lab_argv(list(getattr(args, "lab_args", [])), root=os.geteuid() == 0)
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        raise GPUlayerError(
            f"cannot start JupyterLab: {exc}", hint="install it with ./install.sh"
        ) from None
    return 0  # pragma: no cover - execv does not return


COMMANDS: dict[str, Handler] = {COMMAND: cmd_lab}
