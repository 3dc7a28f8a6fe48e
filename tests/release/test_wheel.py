"""The wheel and sdist, verified as a user gets them (issue 18, item 3).

One build (``gl_dist``: the sdist, then the wheel from it, with no Node.js on PATH) is shared by
every check; two fresh venvs install it, also without Node.js: one with the core dependencies
only, one with the ``jupyter`` extra.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import ROOT, Dist, make_venv, no_node_env

# Wheels are built and installed into fresh venvs: minutes of a core when the suite's xdist
# workers share the machine, past the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


notices = _script("third_party_notices")

LAB = "share/jupyter/labextensions/@gpulayer/jupyterlab"


def run(bin_dir: Path, argv: list[str], env: dict[str, str], **kw: object) -> str:
    """Run a program of the venv; its stdout and stderr together (asserting success)."""
    r = subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        **kw,  # type: ignore[call-overload]
    )
    assert r.returncode == 0, f"{argv}: {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)  # without the colours


def user_env(no_node: Path, bin_dir: Path, home: Path) -> dict[str, str]:
    """A user's shell on a machine without Node: the venv first, state in ``home``."""
    dirs = {}
    for name, sub in (
        ("GPULAYER_HOME", "gpulayer"),
        ("JUPYTER_CONFIG_DIR", "jupyter-config"),
        ("JUPYTER_DATA_DIR", "jupyter-data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
        ("IPYTHONDIR", "ipython"),
    ):
        (home / sub).mkdir(parents=True, exist_ok=True)
        dirs[name] = str(home / sub)
    # pip keeps the real cache (a fresh HOME would download every dependency again).
    cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    return no_node_env(no_node, bin_dir, HOME=str(home), PIP_CACHE_DIR=cache, **dirs)


@pytest.fixture(scope="module")
def core(gl_dist: Dist, gl_no_node_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel and its core dependencies only (no torch, no Jupyter)."""
    home = tmp_path_factory.mktemp("core-user")
    env = user_env(gl_no_node_bin, home / "venv" / "bin", home)
    return make_venv(home / "venv", str(gl_dist.wheel), env=env)


def test_the_build_needed_no_node_and_ships_the_panel(gl_dist: Dist) -> None:
    assert "No build required" in gl_dist.build_log  # the sdist's bundle was used as it is
    package = json.loads((ROOT / "package.json").read_text())
    assert gl_dist.version == package["version"]  # one place: package.json
    with zipfile.ZipFile(gl_dist.wheel) as whl:
        names = set(whl.namelist())
        meta = whl.read(f"gpulayer-{gl_dist.version}.dist-info/METADATA").decode()
        built = json.loads(whl.read(f"gpulayer-{gl_dist.version}.data/data/{LAB}/package.json"))
    data = f"gpulayer-{gl_dist.version}.data/data"
    assert f"{data}/{LAB}/static/style.js" in names
    assert f"{data}/{LAB}/static/third-party-licenses.json" in names  # a production build
    assert f"{data}/{LAB}/install.json" in names
    assert f"{data}/etc/jupyter/jupyter_server_config.d/gpulayer.json" in names
    assert "gpulayer_kernel/_version.py" in names and "gpulayer_kernel/py.typed" in names
    assert built["version"] == gl_dist.version
    assert "License-Expression: Apache-2.0" in meta
    for name in ("LICENSE", "NOTICE", "THIRD-PARTY-NOTICES.md"):
        assert f"gpulayer-{gl_dist.version}.dist-info/licenses/{name}" in names
    assert not any(n.startswith("tests/") for n in names)
    with tarfile.open(gl_dist.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert "gpulayer_kernel/labextension/static/style.js" in members  # rebuilds without Node
    assert {"LICENSE", "NOTICE", "THIRD-PARTY-NOTICES.md", "package.json"} <= members
    assert not any(m.startswith(("node_modules/", ".venv/")) for m in members)


def test_the_third_party_notice_covers_what_the_bundle_contains(gl_dist: Dist) -> None:
    report = json.loads((gl_dist.tree / notices.REPORT).read_text())
    assert report["packages"], "the production build bundles nothing third-party?"
    expected = notices.render(report)
    assert (ROOT / "THIRD-PARTY-NOTICES.md").read_text() == expected, (
        "THIRD-PARTY-NOTICES.md is stale: run `jlpm build:prod && python "
        "scripts/third_party_notices.py`"
    )


def test_core_install_runs_a_job_without_torch_or_jupyter(
    gl_dist: Dist, core: Path, gl_no_node_bin: Path, tmp_path: Path
) -> None:
    env = user_env(gl_no_node_bin, core, tmp_path)
    probe = (
        "import importlib.util as u, gpulayer_kernel as g; "
        "print(g.__version__, [m for m in ('torch', 'IPython', 'jupyter_server', 'jupyterlab', "
        "'ipywidgets') if u.find_spec(m)])"
    )
    assert run(core, ["python", "-c", probe], env).strip() == f"{gl_dist.version} []"
    assert run(core, ["gpulayer", "--version"], env).strip() == f"gpulayer {gl_dist.version}"
    out = run(core, ["gpulayer", "run", "--", "python", "-c", "print(1)"], env, cwd=tmp_path)
    assert re.search(r"^1$", out, re.M), out
    # Without the jupyter extra: a clear error naming it, not an ImportError traceback.
    magic = subprocess.run(
        [str(core / "python"), "-c", "import gpulayer_kernel as g; g.load_ipython_extension(0)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert magic.returncode == 1
    last = magic.stderr.strip().splitlines()[-1]
    assert last.startswith("gpulayer_kernel.errors.MissingExtra: the %%gpulayer magics"), last
    assert "pip install 'gpulayer[jupyter]'" in last
    lab = subprocess.run(
        [str(core / "gpulayer"), "lab"], env=env, capture_output=True, text=True, timeout=60
    )
    assert lab.returncode == 2 and "hint: pip install 'gpulayer[jupyter]'" in lab.stderr


def test_with_the_jupyter_extra_both_extensions_are_enabled_and_ok(
    gl_dist: Dist, gl_no_node_bin: Path, tmp_path: Path
) -> None:
    env = user_env(gl_no_node_bin, tmp_path / "venv" / "bin", tmp_path)
    bin_dir = make_venv(tmp_path / "venv", f"{gl_dist.wheel}[jupyter]", env=env)
    labs = run(bin_dir, ["jupyter", "labextension", "list"], env)
    assert re.search(rf"@gpulayer/jupyterlab v{re.escape(gl_dist.version)} enabled\s+OK", labs), (
        labs
    )
    servers = run(bin_dir, ["jupyter", "server", "extension", "list"], env)
    assert re.search(r"gpulayer_kernel\.jupyter\s+enabled", servers), servers
    assert re.search(rf"gpulayer_kernel\.jupyter\s+{re.escape(gl_dist.version)}\s+OK", servers), (
        servers
    )
    assert sys.executable not in labs + servers  # the fresh venv, not this one
