"""What a release is made of, built once per test session: the wheel and the sdist.

``gl_dist`` copies the tracked files into a temporary tree (the working tree is never written),
builds the panel there for production (``jlpm build:prod``, with Node.js, reusing this checkout's
``node_modules``), then runs ``python -m build`` with **no Node.js on PATH**: it makes the sdist,
and then the wheel from that sdist, so the wheel under test is exactly what ``pip install
gpulayer-X.tar.gz`` would build on a machine without Node. ``no_node_path()`` is that PATH.

Without Node.js/jlpm or outside a git checkout these tests skip on a developer machine and fail
in CI (``CI`` set), where install.sh provides both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
NODE_TOOLS = {"node", "nodejs", "npm", "npx", "yarn", "yarnpkg", "corepack"}


def unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def gl_no_node_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with links to every program on this PATH except Node.js and its package
    managers: a machine without Node, with everything else a shell would find."""
    out = tmp_path_factory.mktemp("no-node-bin")
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue  # a PATH entry that does not exist
        if Path(folder).resolve() == VENV_BIN.resolve():
            continue
        for name in names:
            path = os.path.join(folder, name)
            if name in NODE_TOOLS or (out / name).exists():
                continue
            if os.path.isfile(path) and os.access(path, os.X_OK):
                (out / name).symlink_to(path)
    return out


def no_node_env(no_node_bin: Path, *first: Path, **extra: str) -> dict[str, str]:
    """The environment of a machine without Node.js: ``first`` folders, then ``no_node_bin``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAYER_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([*map(str, first), str(no_node_bin)])
    env.update(extra)
    return env


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    tree: Path  # the copied source tree, with its production build of the panel
    build_log: str
    version: str


@pytest.fixture(scope="session")
def gl_dist(tmp_path_factory: pytest.TempPathFactory, gl_no_node_bin: Path) -> Dist:
    """The sdist, and the wheel built from it without Node.js (see the module docstring)."""
    jlpm = shutil.which("jlpm", path=os.pathsep.join([str(VENV_BIN), os.environ["PATH"]]))
    if jlpm is None or shutil.which("node") is None or not (ROOT / "node_modules").is_dir():
        unavailable("jlpm, node or node_modules missing (./install.sh --dev provides them)")
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if files.returncode != 0:
        unavailable("not a git checkout: the release tests copy the tracked files")
    base = tmp_path_factory.mktemp("release")
    tree = base / "src"
    for name in files.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    (tree / "node_modules").symlink_to(ROOT / "node_modules")
    with_node = {**os.environ, "PATH": os.pathsep.join([str(VENV_BIN), os.environ["PATH"]])}
    r = subprocess.run(
        [str(jlpm), "build:prod"],
        cwd=tree,
        env=with_node,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (tree / "node_modules").unlink()  # as in a release tree: the build must not need it
    out = base / "dist"
    # VENV_BIN first for the build backends' own scripts (jlpm is a Python script; it is not
    # run, since the bundle is newer than its sources), then a PATH without Node.js.
    r = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        env=no_node_env(gl_no_node_bin, VENV_BIN),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    version = wheel.name.split("-")[1]
    return Dist(wheel, sdist, tree, r.stdout + r.stderr, version)


def make_venv(path: Path, *requirements: str, env: dict[str, str]) -> Path:
    """A fresh venv at ``path`` (no system site-packages) with ``requirements``; its bin."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    bin_dir = path / "bin"
    # --no-compile: a throwaway venv; byte-compiling every installed file up front is ~25% of
    # the install's CPU, and the few modules a test imports compile as they load.
    r = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-compile", *requirements],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return bin_dir
