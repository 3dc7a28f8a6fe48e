"""``gpulayer lab``: start JupyterLab (its server extension hosts the control plane)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import GPUlayerError
from .common import Handler


def add_parsers(sub: Any) -> None:
    """Add lab to the ``gpulayer`` sub-parsers."""
    lab = sub.add_parser(
        "lab", help="start JupyterLab with GPUlayer on the embedded default, at the quickstart"
    )
    lab.add_argument("notebook", nargs="?", default=None, help="notebook to open")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER, help="-- more `jupyter lab` options")


async def cmd_lab(args: argparse.Namespace) -> int:
    """Replace this process with ``jupyter lab`` (the server extension hosts the control plane)."""
    notebook = args.notebook
    if notebook is None:
        quickstart = Path("notebooks/01-quickstart.ipynb")
        notebook = str(quickstart) if quickstart.exists() else None
    argv = [sys.executable, "-m", "jupyterlab"]
    if notebook:
        argv.append(notebook)
    if os.geteuid() == 0:
        argv.append("--allow-root")  # JupyterLab refuses root without it (containers, CI)
    extra = list(args.lab_args)
    argv.extend(extra[1:] if extra[:1] == ["--"] else extra)
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        raise GPUlayerError(
            f"cannot start JupyterLab: {exc}", hint="install it with ./install.sh"
        ) from None
    return 0  # pragma: no cover - execv does not return


COMMANDS: dict[str, Handler] = {"lab": cmd_lab}
