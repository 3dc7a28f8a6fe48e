"""The SSH provider installs GPUlayer from the control plane's own wheel by default (issue 24,
item 7): copied over the connection, ``pip install``-ed into the host's venv, no index asked."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel.errors import ProviderError
from gpulayer_kernel.providers import LaunchSpec
from gpulayer_kernel.selfwheel import DIST_ENV
from gpulayer_kernel.testing.sshd import SSHServer
from tests.release.test_dist import installed_tree

from .test_sshfleet import fleet, known_hosts

pytestmark = pytest.mark.slow


def a_wheel(tmp: Path, version: str) -> Path:
    """A small wheel of "gpulayer VERSION" whose worker command only says it ran."""
    from importlib import metadata

    from gpulayer_kernel.selfwheel import pack_installed

    site = tmp / "site"
    installed_tree(site)
    info = site / "gpulayer-9.9.9.dist-info"
    meta = (info / "METADATA").read_text().replace("9.9.9", version)
    (info / "METADATA").write_text(meta)
    moved = info.rename(site / f"gpulayer-{version}.dist-info")
    record = (moved / "RECORD").read_text().replace("gpulayer-9.9.9", f"gpulayer-{version}")
    (moved / "RECORD").write_text(record)
    return pack_installed(tmp / "dist", metadata.Distribution.at(moved))


async def test_the_default_install_copies_and_installs_the_served_wheel(
    gl_sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = known_hosts(tmp_path, gl_sshd.known_hosts_line())
    venv, work = tmp_path / "remote-venv", tmp_path / "w"
    p = fleet(gl_sshd, known, work, venv=venv)  # no install command: the default
    wheel = a_wheel(tmp_path, p.version)
    monkeypatch.setenv(DIST_ENV, str(wheel))
    offer = (await p.offers())[0]
    how = LaunchSpec("0123456789ab", "box1-test", "http://127.0.0.1:9")
    external = await p.launch(offer, "glt_i_000000000000_secret", how)
    try:
        assert (work / "dist" / wheel.name).read_bytes() == wheel.read_bytes()
        # cwd: not this checkout, whose gpulayer_kernel would be imported first.
        python = [str(venv / "bin" / "python"), "-c", "import gpulayer_kernel as g; print(g.VALUE)"]
        version = subprocess.run(python, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert version.stdout.strip() == "42"  # the served wheel's code, not the index's
    finally:
        await p.terminate("0123456789ab", external)


async def test_no_wheel_to_serve_is_a_clear_provider_error(
    gl_sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = known_hosts(tmp_path, gl_sshd.known_hosts_line())
    p = fleet(gl_sshd, known, tmp_path / "w", venv=tmp_path / "remote-venv")
    monkeypatch.setenv(DIST_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    offer = (await p.offers())[0]
    with pytest.raises(ProviderError) as info:
        await p.launch(offer, "glt_i_x", LaunchSpec("0123456789ab", "b", "http://127.0.0.1:9"))
    assert info.value.code == "dist_unavailable" and "hosts install" in info.value.hint
