"""The control plane serves its own wheel (``GET /api/v1/dist``; issue 24, item 7).

Where the wheel comes from (``selfwheel.py``): ``$GPULAYER_DIST``, else the installed
distribution packed back into a wheel. The packing is checked on a small distribution laid out
as pip lays one out, and the result is installed by pip; the route behind a join token, on a
real HTTP server.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path

import pytest

from gpulayer_kernel import __version__
from gpulayer_kernel.errors import NotFound
from gpulayer_kernel.selfwheel import DIST_ENV, pack_installed, served_wheel
from tests.api.conftest import Api, start_api, stop_api

# Builds and installs into fresh environments: past 120 s when xdist workers share the cores.
pytestmark = pytest.mark.timeout(600)

INFO = "gpulayer-9.9.9.dist-info"


def installed_tree(site: Path) -> metadata.Distribution:
    """A distribution as pip leaves it: its files, bytecode, a script in bin/, pip's extras."""
    pkg = site / "gpulayer_kernel"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    (pkg / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0bytecode")
    info = site / INFO
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer\nVersion: 9.9.9\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    (info / "entry_points.txt").write_text("[console_scripts]\ngpulayer = gpulayer_kernel:x\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "direct_url.json").write_text('{"url": "file:///w/gpulayer.whl", "archive_info": {}}')
    rows = [
        "gpulayer_kernel/__init__.py,,",
        "gpulayer_kernel/__pycache__/__init__.cpython-311.pyc,,",
        "../../../bin/gpulayer,,",
        *(f"{INFO}/{n},," for n in ("METADATA", "WHEEL", "entry_points.txt", "INSTALLER")),
        f"{INFO}/direct_url.json,,",
        f"{INFO}/RECORD,,",
    ]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return metadata.Distribution.at(info)


def test_the_installed_distribution_packs_into_a_wheel_pip_installs(tmp_path: Path) -> None:
    dist = installed_tree(tmp_path / "site")
    wheel = pack_installed(tmp_path / "cache", dist)
    assert wheel.name == "gpulayer-9.9.9-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert names == {
        "gpulayer_kernel/__init__.py",
        *(f"{INFO}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt", "RECORD")),
    }  # no bytecode, no bin/ script, none of pip's own files
    assert pack_installed(tmp_path / "cache", dist) == wheel  # once per version: cached
    target = tmp_path / "target"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr  # pip checks every RECORD hash
    assert (target / "gpulayer_kernel" / "__init__.py").read_text() == "VALUE = 42\n"


def test_an_editable_install_or_a_wrong_dist_setting_says_what_to_do(tmp_path: Path) -> None:
    dist = installed_tree(tmp_path / "site")
    (tmp_path / "site" / INFO / "direct_url.json").write_text(
        '{"url": "file:///w", "dir_info": {"editable": true}}'
    )
    with pytest.raises(NotFound) as info:
        pack_installed(tmp_path / "cache", dist)
    assert info.value.code == "dist_unavailable" and DIST_ENV in info.value.hint
    with pytest.raises(NotFound) as info:
        served_wheel({DIST_ENV: str(tmp_path)})  # a folder without this version's wheel
    assert info.value.code == "dist_unavailable" and f"gpulayer-{__version__}-" in str(info.value)
    other = tmp_path / "gpulayer-0.0.1-py3-none-any.whl"
    other.write_bytes(b"PK")
    with pytest.raises(NotFound):
        served_wheel({DIST_ENV: str(other)})  # another version's wheel is never served


@pytest.fixture
async def api_with_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    wheel = tmp_path / "dist" / f"gpulayer-{__version__}-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK-not-really-a-wheel" * 1000)
    monkeypatch.setenv(DIST_ENV, str(wheel.parent))
    api = await start_api(tmp_path)
    api.extra["wheel"] = wheel
    try:
        yield api
    finally:
        await stop_api(api)


async def test_the_wheel_is_served_behind_a_join_token(api_with_wheel: Api) -> None:
    api = api_with_wheel
    wheel: Path = api.extra["wheel"]
    r = await api.call("GET", "/dist", "join")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["wheel"] == wheel.name and info["size"] == wheel.stat().st_size
    assert info["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    got = await api.call("GET", f"/dist/{wheel.name}", "join")
    assert got.status_code == 200 and got.content == wheel.read_bytes()
    assert (await api.call("GET", f"/dist/{wheel.name}", None)).status_code == 401
    assert (await api.call("GET", "/dist", "client")).status_code == 403
    other = await api.call("GET", "/dist/gpulayer-0.0.1-py3-none-any.whl", "join")
    assert other.status_code == 404 and other.json()["code"] == "dist_not_found"
    assert wheel.name in other.json()["message"]
