"""The package's layout keeps telling its architecture (issue 26, ADR 0001, docs/architecture.md):
no import cycles, no two modules of a folder whose names differ by one letter, no long module
without its reason, and every import the docs show still works after a move."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpulayer_kernel"
LONG = 500
LONG_REASON = "# Over 500 lines:"


def modules() -> list[Path]:
    built = PACKAGE / "labextension"
    return sorted(p for p in PACKAGE.rglob("*.py") if built not in p.parents)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def one_letter_apart(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def test_one_letter_apart() -> None:
    assert one_letter_apart("session", "sessions") and one_letter_apart("calls", "cells")
    assert not one_letter_apart("jobs", "jobs") and not one_letter_apart("run", "runner")


def test_no_two_modules_of_a_folder_differ_by_one_letter() -> None:
    folders: dict[Path, set[str]] = {}
    for path in modules():
        name = path.parent.name if path.name == "__init__.py" else path.stem
        folder = path.parent.parent if path.name == "__init__.py" else path.parent
        folders.setdefault(folder, set()).add(name)
    close = [
        f"{folder.relative_to(ROOT)}: {a} / {b}"
        for folder, names in folders.items()
        for a in sorted(names)
        for b in sorted(names)
        if a < b and one_letter_apart(a, b)
    ]
    assert not close, "names a reader confuses: " + "; ".join(close)


def test_a_module_over_500_lines_says_why_on_its_first_line() -> None:
    long = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in modules()
        if (n := len(p.read_text().splitlines())) > LONG
        and not p.read_text().startswith(LONG_REASON)
    ]
    assert not long, f"split these, or start them with '{LONG_REASON} <why>': {long}"


def imports_of(module: str, tree: ast.AST) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in it (TYPE_CHECKING included)."""
    out: set[str] = set()
    package = module.split(".") if module.endswith("__init__") else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    return out


def test_no_import_cycles_between_modules() -> None:
    """Static imports, lazy and TYPE_CHECKING ones included: a package's ``__init__`` re-exports
    are not edges (importing ``a.b`` runs ``a/__init__``, which is not a dependency of design)."""
    paths = {
        module_name(p) + (".__init__" if p.name == "__init__.py" else ""): p for p in modules()
    }
    known = {m.removesuffix(".__init__") for m in paths}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        if name.endswith(".__init__"):
            continue
        deps = imports_of(name, ast.parse(path.read_text()))
        graph[name] = {d for d in deps if d in known and d != name and f"{d}.__init__" not in paths}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


FROM_IMPORT = re.compile(
    r"^\s*from\s+(gpulayer_kernel[\w.]*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.MULTILINE
)
IMPORT = re.compile(r"^\s*import\s+(gpulayer_kernel[\w.]*)", re.MULTILINE)


def documented_imports() -> set[tuple[str, str]]:
    """(module, name) for every import in the guides, the README, the ADRs and the notebooks."""
    texts = [p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]]
    texts += [p.read_text() for p in (ROOT / "adr").glob("*.md")]
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    found: set[tuple[str, str]] = set()
    for text in texts:
        for module, names in FROM_IMPORT.findall(text):
            for name in names.strip("()").replace("\n", " ").split(","):
                name = name.split(" as ")[0].strip()
                if name and name != "*":
                    found.add((module, name))
        found.update((module, "") for module in IMPORT.findall(text))
    return found


def test_the_docs_show_imports() -> None:
    shown = documented_imports()
    assert ("gpulayer_kernel", "job") in shown and ("gpulayer_kernel.torch", "Trainer") in shown


@pytest.mark.parametrize(
    ("module", "name"),
    sorted(
        documented_imports()
        | {
            # The names the package's moves (issue 26) kept where users had them.
            ("gpulayer_kernel.client", "Client"),
            ("gpulayer_kernel.client", "AsyncClient"),
            ("gpulayer_kernel", "open_session"),
            ("gpulayer_kernel.sessions", "start_session"),
        }
    ),
)
def test_every_import_the_docs_show_works(module: str, name: str) -> None:
    if module.startswith("gpulayer_kernel.torch"):
        pytest.importorskip("torch")
    imported = importlib.import_module(module)
    if name:
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), (
            f"the docs import {name} from {module}, which no longer has it"
        )
