"""The JupyterLab panel's own checks (prettier, eslint, strict tsc, vitest) and its built bundle;
its contract types are checked against schema.json in test_panel_contracts.py.

They run here so that the README's one test command covers the TypeScript side too. Without
Node.js/jlpm they skip on a developer machine and fail in CI (``CI`` set), where install.sh
provides both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# jlpm builds, lints and type-checks the panel: past 120 s when xdist workers share the cores.
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = str(Path(sys.executable).parent)


def _jlpm() -> str:
    found = shutil.which("jlpm", path=os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")]))
    if found is None or shutil.which("node") is None:
        message = "jlpm/node not available (./install.sh --dev installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def _run(*args: str, **more_env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, **more_env}
    return subprocess.run(
        [_jlpm(), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def node_modules() -> None:
    if not (ROOT / "node_modules").is_dir():
        r = _run("install", "--immutable")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.slow
def test_typescript_lint_and_strict_types(node_modules: None) -> None:
    r = _run("lint:check")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_typescript_unit_tests(node_modules: None) -> None:
    r = _run("test")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout


@pytest.mark.slow
def test_the_cell_widget_is_what_its_typescript_sources_build(
    node_modules: None, tmp_path: Path
) -> None:
    """gpulayer_kernel/jupyter/widget.js is kept in the repository (the widget works without
    Node.js); it must be exactly what ``jlpm build:widget`` makes of labextension/src/widget/."""
    built = tmp_path / "widget.js"
    r = _run("build:widget", WIDGET_OUT=str(built))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    committed = ROOT / "gpulayer_kernel" / "jupyter" / "widget.js"
    assert built.read_text() == committed.read_text(), "run `jlpm build:widget` and commit it"


def test_the_built_panel_ships_in_the_package() -> None:
    bundle = ROOT / "gpulayer_kernel" / "labextension"
    if not (bundle / "package.json").exists():
        message = "the lab extension is not built (pip install -e . builds it when Node.js exists)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    assert (bundle / "static" / "style.js").exists()
