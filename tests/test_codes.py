"""The error-code registry (issue 34): every code the package raises or sends is an ``ErrorCode``,
each is described in ``codes.toml``, and docs/troubleshooting.md's table is generated from it."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import gpulayer_kernel
from gpulayer_kernel.api.errors import HTTP_CODES
from gpulayer_kernel.codes import TROUBLESHOOTING, ErrorCode, docs, table
from gpulayer_kernel.errors import GPUlayerError

PACKAGE = Path(gpulayer_kernel.__file__).parent


def error_classes() -> dict[str, type[GPUlayerError]]:
    """Every GPUlayerError subclass the package defines, by name."""
    found: dict[str, type[GPUlayerError]] = {}
    for m in pkgutil.walk_packages(gpulayer_kernel.__path__, "gpulayer_kernel."):
        if m.name.endswith("__main__") or ".labextension" in m.name:
            continue
        try:
            mod = importlib.import_module(m.name)
        except ImportError:  # an optional extra (asyncssh, torch) absent: its file is scanned
            continue
        for value in vars(mod).values():
            if isinstance(value, type) and issubclass(value, GPUlayerError):
                found[value.__name__] = value
    return found


def raised_codes() -> dict[str, str]:
    """code -> where, for every ``code="..."`` given to an error (or a helper that makes one)
    and every ``code = "..."`` of an error class, read from the source."""
    classes = error_classes()
    makers = {*classes, "not_yours"}  # security.roles.not_yours(what, code=...) builds Forbidden
    out: dict[str, str] = {cls.code: cls.__module__ for cls in classes.values()}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name not in makers:
                continue
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                    out.setdefault(str(kw.value.value), f"{path.name}:{node.lineno}")
    return out


def test_every_raised_code_is_registered_and_documented() -> None:
    registered = {c.value for c in ErrorCode}
    raised = raised_codes()
    missing = {c: where for c, where in raised.items() if c not in registered}
    assert not missing, f"add these to gpulayer_kernel/codes.py and codes.toml: {missing}"
    sent = set(HTTP_CODES.values())
    assert sent <= registered, sent - registered
    described = docs()
    assert set(described) == registered, set(described) ^ registered
    for code, doc in described.items():
        assert isinstance(doc["status"], int) and 400 <= doc["status"] < 600, code
        assert str(doc["when"]).strip() and str(doc["todo"]).strip(), code


def test_a_registered_code_is_raised_somewhere() -> None:
    """No dead entries: each code is raised, sent, or named by the package."""
    raised = set(raised_codes()) | set(HTTP_CODES.values())
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "codes.py")
    unused = [c.value for c in ErrorCode if c.value not in raised and f'"{c.value}"' not in source]
    assert not unused, f"registered but never raised: {unused}"


def test_the_troubleshooting_table_is_generated_from_the_registry() -> None:
    assert table() in TROUBLESHOOTING.read_text(), (
        "docs/troubleshooting.md is stale: run `python -m gpulayer_kernel.codes --write-docs`"
    )
