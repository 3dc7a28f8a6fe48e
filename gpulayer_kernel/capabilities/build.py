"""Which torch is installed, read from its files: the facts its build fixed, without importing it.

Importing torch costs 1-2 s of CPU (ADR 0005), more than everything else a cold start does. What
its build decided is written in ``torch/version.py`` as plain assignments (``__version__``,
``cuda``, ``hip``), which ``ast`` reads in well under a millisecond without running any of it.
That is enough for the first answer (``local.py``): the version for the UI and the kind of build
(CUDA, ROCm or CPU). What only a running torch can tell — whether CUDA initialises on this driver,
MPS, the distributed backends, the devices torch sees — is not guessed: it stays unset until the
isolated probe has imported torch, in the background or from the per-machine cache.

``install_stamp`` is the install's identity for the cache key: the path and the size and
modification time of ``version.py``, which any reinstall or upgrade rewrites.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path

Finder = Callable[[str], ModuleSpec | None]


@dataclass(frozen=True, slots=True)
class TorchBuild:
    """What ``torch/version.py`` says."""

    version: str
    cuda: str | None
    hip: str | None
    stamp: str  # the install's identity (see the module docstring)


def torch_dir(find_spec: Finder = importlib.util.find_spec) -> Path | None:
    """The installed torch package's folder, found without importing it; None without torch."""
    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):  # a broken path entry, or torch half-imported elsewhere
        return None
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None
    return Path(spec.origin).parent


def parse_version_file(text: str) -> dict[str, str | None]:
    """The module-level string (or None) assignments of ``torch/version.py``; nothing is run."""
    out: dict[str, str | None] = {}
    for node in ast.parse(text).body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            if value.value is None or isinstance(value.value, str):
                out[target.id] = value.value
    return out


def read_torch_build(find_spec: Finder = importlib.util.find_spec) -> TorchBuild | None:
    """The installed torch's build facts, or None when torch is not installed (or unreadable:
    then the import check says why)."""
    folder = torch_dir(find_spec)
    if folder is None:
        return None
    path = folder / "version.py"
    try:
        stat = path.stat()
        facts = parse_version_file(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    version = facts.get("__version__")
    if not version:
        return None
    return TorchBuild(
        version=version,
        cuda=facts.get("cuda") or None,
        hip=facts.get("hip") or None,
        stamp=f"{path}:{stat.st_size}:{stat.st_mtime_ns}",
    )


def install_stamp(build: TorchBuild | None, find_spec: Finder = importlib.util.find_spec) -> str:
    """The torch install's identity for the cache key ("none" without torch)."""
    if build is not None:
        return build.stamp
    folder = torch_dir(find_spec)
    return f"unreadable:{folder}" if folder is not None else "none"
