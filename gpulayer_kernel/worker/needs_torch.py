"""Whether a Python job should start from the torch-loaded zygote: judged from its source's AST.

A job forked from a torch-loaded process pays for torch's address space at fork and at exit (6–10
ms of page-table work on a 2-core box), which a cell like ``1 + 1`` does not need. A job that
imports torch and starts from the light zygote pays the import itself (~2 s). Both are correct:
routing only changes the speed. So the judgement is cheap and static, never runs the job's code,
and never raises:

- torch-needing when the source imports ``torch`` or a package that imports it on import
  (:data:`TORCH_USERS`: torchvision, lightning, transformers…), or one of this package's
  modules that does (:data:`GPULAYER_TORCH_MODULES`); through ``import``, ``from … import``,
  ``importlib.import_module("…")`` and ``__import__("…")`` with a literal name;
- torch-needing when it cannot be judged: source that does not parse (the job's interpreter may
  be newer than the worker's and accept it), a dynamic import of a computed name, a file over
  :data:`MAX_SOURCE` bytes, an entry module (``pkg.mod:func``) that is neither among the job's
  files nor in the standard library. Being wrong that way costs
  a job ~10 ms; being wrong the other way costs it a torch import, seconds;
- a job's own modules (files beside it in its bundle) are followed, up to :data:`MAX_FILES`.

Not seen (the job then imports torch itself, only slower): imports inside ``exec``'d strings,
and packages that import torch lazily, on first use.
"""

from __future__ import annotations

import ast
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "GPULAYER_TORCH_MODULES",
    "MAX_FILES",
    "MAX_SOURCE",
    "TORCH_USERS",
    "entry_needs_torch",
    "imports_of",
    "needs_torch",
]

TORCH_USERS = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchtext",
        "torchdata",
        "torchmetrics",
        "torchrec",
        "functorch",
        "lightning",
        "lightning_fabric",
        "pytorch_lightning",
        "accelerate",
        "deepspeed",
        "timm",
        "peft",
        "diffusers",
        "transformers",
        "sentence_transformers",
        "torch_geometric",
        "xformers",
        "bitsandbytes",
        "fairscale",
    }
)
"""Top-level packages that import torch when imported."""

GPULAYER_TORCH_MODULES = frozenset({"gpulayer_kernel.torch", "gpulayer_kernel.job.ranks"})
"""This package's modules that import torch at import (``gpulayer_kernel.torch`` re-exports
``job.ranks``); their submodules count too."""

MAX_SOURCE = 1 << 20  # bytes of one file judged; a bigger one reads as torch-needing
MAX_FILES = 64  # of a job's own modules followed from its entry point
INPUTS_FILE = "gpulayer-inputs.safetensors"  # transfer.CELL_INPUTS: tensors a cell gets as --in
_IMPORT_FUNCS = frozenset({"import_module", "__import__"})
UNKNOWN = "?"  # stands for an import whose module cannot be named statically


def imports_of(source: str) -> frozenset[str] | None:
    """The absolute module names ``source`` imports (``"."`` prefixed for relative ones, and
    :data:`UNKNOWN` for a computed one); None when it does not parse."""
    try:
        # The job's own compile warns about its code (``"\d"``); the worker's log should not.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.add(base)
            # ``from pkg import sub`` may import the submodule pkg.sub
            sep = "" if base.endswith(".") else "."
            found.update(f"{base}{sep}{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and _call_name(node.func) in _IMPORT_FUNCS:
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            else:
                found.add(UNKNOWN)
    return frozenset(found)


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_torch_module(name: str) -> bool:
    if name == UNKNOWN or name.split(".", 1)[0] in TORCH_USERS:
        return True
    return any(name == m or name.startswith(m + ".") for m in GPULAYER_TORCH_MODULES)


def needs_torch(source: str) -> bool:
    """Whether code with this text imports torch (or cannot be judged: see the module doc)."""
    names = imports_of(source)
    return names is None or any(_is_torch_module(n) for n in names)


def entry_needs_torch(entrypoint: str, cwd: Path, sources: Mapping[str, str] | None = None) -> bool:
    """Whether a Python job (its runner entry point, its files in ``cwd`` or ``sources``) should
    start from the torch-loaded zygote. Never raises."""
    try:
        return _Judge(cwd, sources or {}).entry(entrypoint)
    except Exception:  # the judgement is an optimisation: when unsure, the bounded cost
        return True


class _Judge:
    """Follows one job's own modules from its entry point; stops at the first torch import."""

    def __init__(self, cwd: Path, sources: Mapping[str, str]) -> None:
        self.cwd = cwd
        self.sources = sources
        self.seen: set[str] = set()

    def entry(self, entrypoint: str) -> bool:
        if not self.sources and (self.cwd / INPUTS_FILE).exists():
            return True  # a cell's --in tensors: decoding them imports torch before the cell
        if entrypoint.startswith("cell:"):
            return self.file(entrypoint.removeprefix("cell:"), "")
        if entrypoint.endswith(".py"):
            return self.file(entrypoint, "")
        module = entrypoint.partition(":")[0]
        if _is_torch_module(module):
            return True
        found = self.module(module)
        if found is None:  # installed, not in the bundle: unseen code, likely the heavy kind
            return module.split(".", 1)[0] not in sys.stdlib_module_names
        return found

    def module(self, name: str) -> bool | None:
        """The verdict on one module of the job's own (None: not among its files)."""
        parts = name.split(".")
        for rel in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
            if rel in self.sources or (self.cwd / rel).is_file():
                # importing a.b runs a/__init__.py first
                parents = ["/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts))]
                return any(self.file(p, name) for p in parents if self._exists(p)) or self.file(
                    rel, name
                )
        return None

    def _exists(self, rel: str) -> bool:
        return rel in self.sources or (self.cwd / rel).is_file()

    def file(self, rel: str, module: str) -> bool:
        """The verdict on one file (``module``: its dotted name, "" for a script or cell)."""
        if rel in self.seen:
            return False
        if len(self.seen) >= MAX_FILES:
            return True
        self.seen.add(rel)
        text = self.sources.get(rel)
        if text is None:
            path = self.cwd / rel
            if path.stat().st_size > MAX_SOURCE:
                return True
            text = path.read_text(errors="replace")
        elif len(text) > MAX_SOURCE:
            return True
        names = imports_of(text)
        if names is None:
            return True
        package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        return any(self.imported(n, package) for n in _sorted(names))

    def imported(self, name: str, package: str) -> bool:
        if name.startswith("."):
            level = len(name) - len(name.lstrip("."))
            base = package.split(".") if package else []
            if level - 1 > len(base):
                return False  # beyond the top: the job fails with ImportError, light or not
            head = base[: len(base) - (level - 1)]
            name = ".".join([*head, name.lstrip(".")]).strip(".")
            if not name:
                return False
        if _is_torch_module(name):
            return True
        return bool(self.module(name))


def _sorted(names: Iterable[str]) -> list[str]:
    return sorted(names)  # a stable order: the same files followed, the same verdict, each time
